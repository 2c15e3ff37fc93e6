// Package metrics exports the aggregator's per-VM figures to Prometheus:
// GPU time, share and queue wait, submissions, traps per BAR, denials,
// hypercalls, page-table scans, watchdog stops, VRAM in use, and the
// daemon's own CPU time and memory (the standard process collector).
//
// Every figure is read from the aggregator when Prometheus scrapes (a
// Collector, no bookkeeping of its own), so a vGPU's series appear when it
// attaches and are gone once it leaves. Names follow Prometheus
// conventions: a gpuvm_ prefix, base units (seconds, bytes), _total on
// counters; vGPUs are labelled by vgpu (slot id) and domain (name), and
// gpuvm_vgpu_info carries the domid, mode and profile. The domid is not on
// every series: a Xen guest that reboots comes back under a new one, and a
// guest in a reboot loop would mint series without end.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuvm/gpuvm/aggregator"
)

// Source is what the collector reads: the aggregator.
type Source interface {
	// VGPUs returns the attached vGPUs.
	VGPUs() []*aggregator.VGPU
	// SchedStats returns every vGPU's scheduler account, by vGPU id.
	SchedStats() map[*aggregator.VGPU]aggregator.SchedStats
	// Layout returns how the board is partitioned.
	Layout() aggregator.Layout
	// OutOfService returns the slots taken out of service, with why.
	OutOfService() map[int]string
}

// counter is one per-vGPU counter taken from aggregator.Counters.
type counter struct {
	desc  *prometheus.Desc
	value func(aggregator.Counters) float64
	kind  prometheus.ValueType
}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src      Source
	counters []counter
	traps    *prometheus.Desc
	info     *prometheus.Desc
	gpuTime  *prometheus.Desc
	subs     *prometheus.Desc
	share    *prometheus.Desc
	busy     *prometheus.Desc
	weight   *prometheus.Desc
	queued   *prometheus.Desc
	wait     *prometheus.Desc
	vram     *prometheus.Desc
	vramUsed *prometheus.Desc
	channels *prometheus.Desc
	slots    *prometheus.Desc // every board's together
	slo      sloDescs
	boards   boardDescs
}

// New returns a collector over src.
func New(src Source) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("gpuvm_"+name, help, append([]string{"vgpu", "domain"}, labels...), nil)
	}
	c := &Collector{src: src,
		traps:    d("vgpu_traps_total", "Guest accesses trapped to the aggregator, by BAR and direction.", "bar", "access"),
		info:     d("vgpu_info", "An attached vGPU (always 1), with its Xen domain id, mode, profile and board.", "domid", "mode", "profile", "board"),
		gpuTime:  d("vgpu_gpu_seconds_total", "GPU time of the vGPU's completed submissions, as the scheduler charged it."),
		subs:     d("vgpu_submissions_total", "Submissions (doorbells) of the vGPU that completed."),
		share:    d("vgpu_gpu_share_ratio", "The vGPU's part of all vGPUs' GPU time over the last second (0 when the GPU was idle)."),
		busy:     d("vgpu_gpu_busy_ratio", "The vGPU's GPU time over the last second, as a fraction of that second."),
		weight:   d("vgpu_weight", "The vGPU's scheduler weight."),
		queued:   d("vgpu_queued_submissions", "Submissions of the vGPU waiting for the GPU now."),
		wait:     d("vgpu_queue_wait_seconds", "Time from a submission's doorbell to its release to the GPU."),
		vram:     d("vgpu_vram_bytes", "VRAM the vGPU's guest sees."),
		vramUsed: d("vgpu_vram_used_bytes", "VRAM of the vGPU's slot holding pages it wrote (its slice's resident pages)."),
		channels: d("vgpu_channels", "Channels (GPU command queues) the vGPU may use."),
		slots:    prometheus.NewDesc("gpuvm_slots", "vGPU slots of the board, by state.", []string{"state"}, nil),
		slo:      newSLODescs(d),
		boards:   newBoardDescs(),
	}
	ctr := func(name, help string, f func(aggregator.Counters) uint64) {
		c.counters = append(c.counters, counter{d(name, help), func(x aggregator.Counters) float64 { return float64(f(x)) }, prometheus.CounterValue})
	}
	ctr("vgpu_denied_total", "Guest accesses denied: registers or addresses the VM may not touch.", func(x aggregator.Counters) uint64 { return x.Denied })
	ctr("vgpu_tlb_flushes_total", "Guest TLB flushes trapped.", func(x aggregator.Counters) uint64 { return x.TLBFlushes })
	ctr("vgpu_page_table_scans_total", "Shadow page-table scans (full and incremental).", func(x aggregator.Counters) uint64 { return x.Scans })
	ctr("vgpu_page_table_entries_scanned_total", "Page-table entries the shadow scans read.", func(x aggregator.Counters) uint64 { return x.PTEsScanned })
	ctr("vgpu_doorbells_total", "Guest doorbells (GP_PUT writes) trapped or found by polling.", func(x aggregator.Counters) uint64 { return x.Doorbells })
	ctr("vgpu_watchdog_stops_total", "Channels the watchdog stopped for holding the GPU too long.", func(x aggregator.Counters) uint64 { return x.WatchdogStops })
	ctr("vgpu_scan_errors_total", "Shadow scans that failed (over the shadow budget, say).", func(x aggregator.Counters) uint64 { return x.ScanErrors })
	ctr("vgpu_hypercalls_total", "Para-virtual hypercalls (traps of the call register).", func(x aggregator.Counters) uint64 { return x.Hypercalls })
	ctr("vgpu_hypercall_operations_total", "Para-virtual operations run (each call of a multicall counts).", func(x aggregator.Counters) uint64 { return x.HypercallOps })
	ctr("vgpu_pv_rejected_total", "Para-virtual calls refused.", func(x aggregator.Counters) uint64 { return x.PVRejected })
	ctr("vgpu_pvdrm_requests_total", "pvdrm requests the back end took off the ring.", func(x aggregator.Counters) uint64 { return x.PVDRMRequests })
	ctr("vgpu_pvdrm_rejected_total", "pvdrm requests answered with an error.", func(x aggregator.Counters) uint64 { return x.PVDRMRejected })
	ctr("vgpu_error_reports_total", "MMU faults and channel errors delivered to the guest.", func(x aggregator.Counters) uint64 { return x.ErrorReports })
	ctr("vgpu_resets_total", "Resets of the vGPU in place (the guest's function-level reset, gpuvm vgpu reset).", func(x aggregator.Counters) uint64 { return x.Resets })
	ctr("vgpu_moves_total", "Moves of the running vGPU to another slot or board.", func(x aggregator.Counters) uint64 { return x.Moves })
	ctr("vgpu_evictions_total", "Times the vGPU was parked to free its slot (VRAM overcommit).", func(x aggregator.Counters) uint64 { return x.Evictions })
	ctr("vgpu_restores_total", "Times the parked vGPU was brought back into a slot.", func(x aggregator.Counters) uint64 { return x.Restores })
	ctr("vgpu_evicted_bytes_total", "VRAM copied out by the vGPU's evictions.", func(x aggregator.Counters) uint64 { return x.EvictedBytes })
	ctr("vgpu_restored_bytes_total", "VRAM copied in by the vGPU's restores.", func(x aggregator.Counters) uint64 { return x.RestoredBytes })
	ctr("vgpu_log_lines_suppressed_total", "Guest-caused log lines held back by the rate limit.", func(x aggregator.Counters) uint64 { return x.LogSuppressed })
	c.counters = append(c.counters,
		counter{d("vgpu_shadow_seconds_total", "Time spent building shadow page tables."),
			func(x aggregator.Counters) float64 { return float64(x.ShadowNs) / 1e9 }, prometheus.CounterValue},
		counter{d("vgpu_restore_wait_seconds_total", "Time the guest waited for a slot to be restored into (VRAM overcommit)."),
			func(x aggregator.Counters) float64 { return float64(x.RestoreWaitNs) / 1e9 }, prometheus.CounterValue},
		counter{d("vgpu_remapped_pages", "Aperture pages passed through to the guest now (BAR remap)."),
			func(x aggregator.Counters) float64 { return float64(x.RemappedPages) }, prometheus.GaugeValue},
		counter{d("vgpu_tracked_pages", "Guest pages the page tracker watches now."),
			func(x aggregator.Counters) float64 { return float64(x.TrackedPages) }, prometheus.GaugeValue},
	)
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, k := range c.counters {
		ch <- k.desc
	}
	for _, d := range []*prometheus.Desc{c.traps, c.info, c.gpuTime, c.subs, c.share, c.busy, c.weight, c.queued, c.wait, c.vram, c.vramUsed, c.channels, c.slots} {
		ch <- d
	}
	c.slo.describe(ch)
	c.boards.describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	stats := c.src.SchedStats()
	vgpus := c.src.VGPUs()
	for _, v := range vgpus {
		lv := []string{strconv.Itoa(v.ID), v.Guest.Name}
		gauge := func(d *prometheus.Desc, val float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, val, append(append([]string(nil), lv...), extra...)...)
		}
		total := func(d *prometheus.Desc, val float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, val, append(append([]string(nil), lv...), extra...)...)
		}
		bi, bname := v.Board()
		if bname == "" {
			bname = strconv.Itoa(bi)
		}
		gauge(c.info, 1, strconv.FormatUint(uint64(v.Guest.DomID), 10), v.Guest.Mode, v.Profile(), bname)
		x := v.Counters()
		for _, t := range []struct {
			bar         string
			reads, wrts uint64
		}{{"0", x.BAR0Reads, x.BAR0Writes}, {"1", x.BAR1Reads, x.BAR1Writes}, {"3", x.BAR3Reads, x.BAR3Writes}} {
			total(c.traps, float64(t.reads), t.bar, "read")
			total(c.traps, float64(t.wrts), t.bar, "write")
		}
		for _, k := range c.counters {
			ch <- prometheus.MustNewConstMetric(k.desc, k.kind, k.value(x), lv...)
		}
		gauge(c.vram, float64(v.Slot.VRAM.Size))
		gauge(c.channels, float64(v.Slot.Chans))
		if used := v.VRAMInUse(); used >= 0 {
			gauge(c.vramUsed, float64(used))
		}
		s, ok := stats[v]
		if !ok {
			continue // leaving
		}
		total(c.gpuTime, s.GPUTime.Seconds())
		total(c.subs, float64(s.Submissions))
		gauge(c.share, s.Share)
		gauge(c.busy, s.Busy)
		gauge(c.weight, float64(s.Weight))
		gauge(c.queued, float64(s.Queued))
		buckets := map[float64]uint64{}
		var cum uint64
		for i, b := range aggregator.WaitBounds() {
			cum += s.WaitBuckets[i]
			buckets[b.Seconds()] = cum
		}
		ch <- prometheus.MustNewConstHistogram(c.wait, s.Released, s.QueueWait.Seconds(), buckets, lv...)
		c.slo.collect(ch, s, lv)
	}
	broken := c.src.OutOfService()
	slots := len(c.src.Layout().Slots)
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(len(vgpus)), "used")
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(len(broken)), "out_of_service")
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(max(slots-len(vgpus)-len(broken), 0)), "free")
	c.boards.collect(ch, c.src)
}

// Handler serves the metrics of Registry(src) in the Prometheus
// exposition formats.
func Handler(src Source) http.Handler {
	return promhttp.HandlerFor(Registry(src), promhttp.HandlerOpts{Timeout: scrapeTimeout, ErrorHandling: promhttp.ContinueOnError,
		MaxRequestsInFlight: maxScrapes})
}

// Registry returns a registry holding a collector over src, the process
// collector (the daemon's own CPU time, memory, file descriptors) and the
// Go runtime collector.
func Registry(src Source) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(New(src), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return r
}

// scrapeTimeout bounds one scrape's handling; maxScrapes how many run at
// once (the others are answered 503 at once).
const (
	scrapeTimeout = 10 * time.Second
	maxScrapes    = 4
)
