package tests

import (
	"io"
	"math"
	"os"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Log budget for guest-caused refusals: a guest that loops refused writes
// may cost at most a few lines per second (plus a summary) in the
// aggregator's log, however fast it loops. The bound below allows 5 lines
// per second per VM, 20 more for summaries and ordinary events, and 2 KiB
// per allowed line.
const (
	logLinesPerSecondPerVM = 5
	logLinesSlack          = 20
	logBytesPerLine        = 2 << 10
)

// logFloodPDEs is how many PDEs of the attacker's page directory name one and
// the same guest page table: each needs a shadow table of its own (256 KiB),
// far more than the per-VM shadow budget (a third of what the 128 MiB
// reserve leaves: ~170 tables), so every scan refuses hundreds of them.
const logFloodPDEs = 1024

// TestRefusalLogFlood: with the aggregator at its default log level (Info),
// an attacker loops refused requests for a few seconds while the honest VM
// computes: channel-table writes beyond its channel quota, channel
// instances naming memory outside its slice, enables of channels without an
// instance, and doorbells that each trigger a page-table scan exceeding its
// shadow budget (1024 PDEs naming the same guest page table). The log
// volume stays bounded (a few lines per second per VM), every refused write
// is still counted in the denied counter, and the honest VM verifies.
func TestRefusalLogFlood(t *testing.T) {
	var lc logCounter
	var echo io.Writer // GPUVM_TEST_LOG=1 shows the log too
	if os.Getenv("GPUVM_TEST_LOG") != "" {
		echo = os.Stderr
	}
	logger := newCountingLogger(&lc, echo)
	const quota = 2 // the attacker's channels
	e := newEnvWith(t, envOptions{Logger: logger, Quota: func(g aggregator.Guest) aggregator.Quota {
		if g.Name == "attacker" {
			return aggregator.Quota{Channels: quota}
		}
		return aggregator.Quota{}
	}})
	// fv-lazy: a guest TLB flush marks the space stale and the next
	// activation (doorbell) scans it; a scan that fails leaves it stale, so
	// every doorbell scans again.
	a := newAttacker(t, e, "attacker", 66, "fv-lazy")
	a.controlCopies(t)
	g := a.inspectChannel(t)
	put := a.put(g)

	// The page directory that exceeds the shadow budget: PDEs 4096.. (VA
	// 512 GiB up, unused by the driver) all name one zeroed guest page table.
	pt, err := a.drv.AllocVRAM(nvc0.SmallPTSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	w0, w1 := nvc0.PDE{SmallPresent: true, SmallAddr: pt}.Encode()
	pdes := make([]uint32, 0, 2*logFloodPDEs)
	for range logFloodPDEs {
		pdes = append(pdes, w0, w1)
	}
	pd := a.vm.PageDir()
	win := a.r.saveWindow()
	a.r.vramWrite(pd+4096*nvc0.PDESize, pdes)
	a.r.restoreWindow(win)
	a.r.flushTLB(t, pd, false)
	a.ring(g, put) // the first scan builds every shadow table the budget allows
	a.r.sync()

	flood := 3 * time.Second
	runs := 10
	if testing.Short() {
		flood, runs = 2*time.Second, 5
	}
	honest, _ := e.startBusyHonest(t, runs)
	av := e.vgpu("attacker")
	outside := nvc0.InstEncode(a.slot.VRAM.Size+16*pageSize, nvc0.ChanInstValid|nvc0.ChanInstPollEnable)
	own := nvc0.InstEncode(a.own, nvc0.ChanInstValid|nvc0.ChanInstPollEnable)

	before, denied0, bells0 := lc.snapshot(), av.Counters().Denied, av.Counters().Doorbells
	start := time.Now()
	refused, rounds := uint64(0), 0
	for time.Since(start) < flood {
		for k := range 256 {
			r := a.r
			r.wr(nvc0.ChanInst(quota+k%(chansPerVM-quota)), own) // beyond the channel quota
			r.wr(nvc0.ChanCtl(quota), nvc0.ChanCtlDefault)       // beyond the quota, enable
			r.wr(nvc0.ChanInst(1), outside)                      // instance outside its slice
			r.wr(nvc0.ChanCtl(1), nvc0.ChanCtlDefault)           // enable without an instance
			refused += 4
		}
		a.ring(g, put) // a scan over the shadow budget
		a.r.sync()
		rounds++
	}
	took := time.Since(start)
	vol := lc.snapshot().sub(before)
	denied := av.Counters().Denied - denied0
	bells := av.Counters().Doorbells - bells0
	secs := math.Ceil(took.Seconds())
	maxLines := int64(2*logLinesPerSecondPerVM*secs) + logLinesSlack
	maxBytes := maxLines * logBytesPerLine
	t.Logf("%v of refusals: %d refused writes and %d doorbells in %d rounds; denied counter +%d; log +%s (bound %d lines, %d bytes)",
		took.Round(time.Millisecond), refused, bells, rounds, denied, vol, maxLines, maxBytes)
	if vol.lines > maxLines || vol.records > maxLines || vol.bytes > maxBytes {
		t.Errorf("guest-caused refusals flooded the log: %s in %v (%.0f lines/s, %.0f KiB/s), bound %d lines and %d bytes; first lines:\n%s",
			vol, took.Round(time.Millisecond), float64(vol.lines)/took.Seconds(), float64(vol.bytes)/1024/took.Seconds(), maxLines, maxBytes, lc.sampleText())
	}
	if denied < refused {
		t.Errorf("the denied counter grew by %d for %d refused writes: refusals must be counted even when they are not logged", denied, refused)
	}
	// Nothing the attacker asked for reached the board.
	for i := quota; i < chansPerVM; i++ {
		p := a.slot.ChanBase + i
		if inst, ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p))), e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p))); inst != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("physical channel %d (beyond the attacker's quota) was set up: instance %#x control %#x", p, inst, ctl)
		}
	}
	if ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(a.slot.ChanBase+1))); ctl&nvc0.ChanCtlEnable != 0 {
		t.Errorf("the attacker's channel 1 (no valid instance) is enabled on the board: control %#x", ctl)
	}
	honest.verified(t)
}
