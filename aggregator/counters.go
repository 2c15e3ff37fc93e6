package aggregator

import (
	"sync/atomic"
	"time"

	"github.com/gpuvm/gpuvm/shadow"
)

// Counters are one vGPU's event counts. The JSON names are those of
// `gpuvm bench --json` and of the control API.
type Counters struct {
	BAR0Reads, BAR0Writes uint64
	BAR1Reads, BAR1Writes uint64
	BAR3Reads, BAR3Writes uint64
	Denied                uint64 // accesses to registers or addresses the VM may not touch, dropped
	TLBFlushes            uint64 // guest TLB flushes trapped
	Scans                 uint64 // shadow page-table scans (full + incremental)
	IncrementalScans      uint64
	PTEsScanned           uint64
	ShadowNs              uint64 // time spent building shadows
	Doorbells             uint64
	PolledDoorbells       uint64 // doorbells found by polling user areas (polled-doorbell mode)
	RemappedPages         uint64 // aperture pages currently passed through
	RemapRevokes          uint64 // RemapRevoke messages sent (docs/protocol.md §6.8): revoke round trips
	RemapRevokedEntries   uint64 // remap entries those messages named
	TrackedPages          uint64 // guest pages the page tracker watches now
	ScanErrors            uint64 // shadow scans that failed (over the shadow budget, say)
	WatchdogStops         uint64 // channels the watchdog stopped
	WedgedChannels        uint64 // channels whose stop never completed (out of service)
	LogSuppressed         uint64 // guest-caused log lines held back by the rate limit
	ErrorReports          uint64 // MMU fault records and PBDMA errors delivered to the guest (faults.go)
	ReportsDropped        uint64 // of those, dropped on a full virtual queue
	Hypercalls            uint64 // PV: hypercalls (traps of RegCall)
	HypercallOps          uint64 // PV: operations run (a multicall counts each of its calls)
	PTEsMapped            uint64 // PV: present entries installed by hypercalls
	PVRejected            uint64 // PV: calls and registrations refused
	PVDRMRequests         uint64 // pvdrm: requests the back end took off the ring
	PVDRMNotifications    uint64 // pvdrm: kicks the back end sent the front end
	PVDRMRejected         uint64 // pvdrm: requests answered with an error
	PVDRMShares           uint64 // pvdrm: buffers whose pages were shared with the guest (GEM_MMAP)
	PVDRMPoolHits         uint64 // pvdrm: GEM_NEW answered from the pool (no new share)
	Resets                uint64 // resets of the vGPU (function-level reset, control API): reset.go
	Moves                 uint64 // moves of the vGPU to another slot or board: move.go
	// Eviction (evict.go). Not in CounterNames: how often a VM is evicted,
	// and how long it waits, depends on the other VMs of its board, which
	// its own guest must not read.
	Evictions     uint64 // times the vGPU was parked to free its slot
	Restores      uint64 // times it was brought back into a slot
	EvictedBytes  uint64 // VRAM copied out by its evictions
	RestoredBytes uint64 // VRAM copied in by its restores
	RestoreWaitNs uint64 // time its guest waited for a slot to be restored into
}

// Map returns the counters under their report names.
func (c Counters) Map() map[string]uint64 {
	return map[string]uint64{
		"bar0_reads": c.BAR0Reads, "bar0_writes": c.BAR0Writes,
		"bar1_reads": c.BAR1Reads, "bar1_writes": c.BAR1Writes,
		"bar3_reads": c.BAR3Reads, "bar3_writes": c.BAR3Writes,
		"denied": c.Denied, "tlb_flushes": c.TLBFlushes, "scans": c.Scans,
		"incremental_scans": c.IncrementalScans, "ptes_scanned": c.PTEsScanned,
		"shadow_ns": c.ShadowNs, "doorbells": c.Doorbells, "polled_doorbells": c.PolledDoorbells,
		"remapped_pages": c.RemappedPages, "remap_revokes": c.RemapRevokes, "remap_revoked_entries": c.RemapRevokedEntries, "tracked_pages": c.TrackedPages, "scan_errors": c.ScanErrors,
		"watchdog_stops": c.WatchdogStops, "wedged_channels": c.WedgedChannels, "log_suppressed": c.LogSuppressed,
		"error_reports": c.ErrorReports, "reports_dropped": c.ReportsDropped,
		"hypercalls": c.Hypercalls, "hypercall_ops": c.HypercallOps, "ptes_mapped": c.PTEsMapped,
		"pv_rejected": c.PVRejected, "pvdrm_requests": c.PVDRMRequests, "pvdrm_notifications": c.PVDRMNotifications,
		"pvdrm_rejected": c.PVDRMRejected, "pvdrm_shares": c.PVDRMShares, "pvdrm_pool_hits": c.PVDRMPoolHits,
		"resets": c.Resets, "moves": c.Moves,
		"evictions": c.Evictions, "restores": c.Restores, "evicted_bytes": c.EvictedBytes,
		"restored_bytes": c.RestoredBytes, "restore_wait_ns": c.RestoreWaitNs,
	}
}

// Report shapes flat counters (CounterNames, or Map) for reports and the
// control API: the per-BAR counts become barN_traps {"read": r, "write": w};
// the others keep their names.
func Report(flat map[string]uint64) map[string]any {
	out := map[string]any{}
	for k, v := range flat {
		out[k] = v
	}
	for _, bar := range []string{"bar0", "bar1", "bar3"} {
		r, rok := flat[bar+"_reads"]
		w, wok := flat[bar+"_writes"]
		if !rok && !wok {
			continue
		}
		delete(out, bar+"_reads")
		delete(out, bar+"_writes")
		out[bar+"_traps"] = map[string]uint64{"read": r, "write": w}
	}
	return out
}

// CounterNames lists the monotonic counters in a fixed order (the IPC
// counters call returns them in this order; a benchmark reports their
// per-run deltas).
func CounterNames() []string {
	return []string{"bar0_reads", "bar0_writes", "bar1_reads", "bar1_writes", "bar3_reads", "bar3_writes",
		"denied", "tlb_flushes", "scans", "incremental_scans", "ptes_scanned", "shadow_ns", "doorbells",
		"polled_doorbells", "scan_errors", "watchdog_stops", "wedged_channels", "log_suppressed",
		"error_reports", "reports_dropped", "hypercalls", "hypercall_ops", "ptes_mapped", "pv_rejected",
		"pvdrm_requests", "pvdrm_notifications", "pvdrm_rejected", "pvdrm_shares", "pvdrm_pool_hits", "resets"}
}

// counters is the live, atomically updated form.
type counters struct {
	reads, writes   [6]atomic.Uint64
	denied          atomic.Uint64
	tlbFlushes      atomic.Uint64
	doorbells       atomic.Uint64
	polledDoorbells atomic.Uint64
	scanErrors      atomic.Uint64
	remapRevokes    atomic.Uint64
	remapRevoked    atomic.Uint64
	watchdogStops   atomic.Uint64
	wedged          atomic.Uint64
	faultReports    atomic.Uint64
	reportsDropped  atomic.Uint64
	hypercalls      atomic.Uint64
	hypercallOps    atomic.Uint64
	ptesMapped      atomic.Uint64
	pvRejected      atomic.Uint64
	pvdrmRequests   atomic.Uint64
	pvdrmNotify     atomic.Uint64
	pvdrmRejected   atomic.Uint64
	pvdrmShares     atomic.Uint64
	pvdrmPoolHits   atomic.Uint64
	resets          atomic.Uint64
	moves           atomic.Uint64
	evictions       atomic.Uint64
	restores        atomic.Uint64
	evictedBytes    atomic.Uint64
	restoredBytes   atomic.Uint64
	restoreWaitNs   atomic.Uint64
	// carried is what the BAR spaces that resets dropped had counted (under
	// VGPU.mu), so that the scan counters stay monotonic.
	carried shadowCarry
}

func (v *VGPU) snapshot() Counters {
	c := &v.ctr
	var sh shadow.Counters
	var tracked int
	if v.shadows != nil { // nil while parked (evict.go)
		sh = v.shadows.Counters()
		tracked = v.shadows.Tracker().Pages()
	}
	bar := shadow.Counters(c.carried) // the shadows' counts before the last reset
	for _, b := range v.bars {
		if b != nil {
			t := b.sp.Totals()
			bar.FullScans += t.FullScans
			bar.PTEsScanned += t.PTEsScanned
			bar.ShadowTime += t.ShadowTime
		}
	}
	return Counters{
		BAR0Reads: c.reads[0].Load(), BAR0Writes: c.writes[0].Load(),
		BAR1Reads: c.reads[1].Load(), BAR1Writes: c.writes[1].Load(),
		BAR3Reads: c.reads[3].Load(), BAR3Writes: c.writes[3].Load(),
		Denied:              c.denied.Load(),
		TLBFlushes:          c.tlbFlushes.Load(),
		Scans:               sh.FullScans + sh.IncrementalScans + bar.FullScans + bar.IncrementalScans,
		IncrementalScans:    sh.IncrementalScans + bar.IncrementalScans,
		PTEsScanned:         sh.PTEsScanned + bar.PTEsScanned,
		ShadowNs:            uint64((sh.ShadowTime + bar.ShadowTime) / time.Nanosecond),
		Doorbells:           c.doorbells.Load(),
		PolledDoorbells:     c.polledDoorbells.Load(),
		RemappedPages:       uint64(v.remappedPages()),
		RemapRevokes:        c.remapRevokes.Load(),
		RemapRevokedEntries: c.remapRevoked.Load(),
		TrackedPages:        uint64(tracked),
		ScanErrors:          c.scanErrors.Load(),
		WatchdogStops:       c.watchdogStops.Load(),
		WedgedChannels:      c.wedged.Load(),
		LogSuppressed:       v.gripe.Suppressed(),
		ErrorReports:        c.faultReports.Load(),
		ReportsDropped:      c.reportsDropped.Load(),
		Hypercalls:          c.hypercalls.Load(),
		HypercallOps:        c.hypercallOps.Load(),
		PTEsMapped:          c.ptesMapped.Load(),
		PVRejected:          c.pvRejected.Load(),
		PVDRMRequests:       c.pvdrmRequests.Load(),
		PVDRMNotifications:  c.pvdrmNotify.Load(),
		PVDRMRejected:       c.pvdrmRejected.Load(),
		PVDRMShares:         c.pvdrmShares.Load(),
		PVDRMPoolHits:       c.pvdrmPoolHits.Load(),
		Resets:              c.resets.Load(),
		Moves:               c.moves.Load(),
		Evictions:           c.evictions.Load(),
		Restores:            c.restores.Load(),
		EvictedBytes:        c.evictedBytes.Load(),
		RestoredBytes:       c.restoredBytes.Load(),
		RestoreWaitNs:       c.restoreWaitNs.Load(),
	}
}
