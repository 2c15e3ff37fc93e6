package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/host"
)

// heteroSpecs returns the boards of a phase's host: the fast one listed
// first (placement breaks ties by configuration order), or one board for
// the references.
func (o HeteroOptions) heteroSpecs(phase string) []boardSpec {
	fast, slow := boardSpec{name: heteroFast, timing: o.Fast}, boardSpec{name: heteroSlow, timing: o.Slow}
	switch phase {
	case HeteroFastOnly:
		return []boardSpec{fast}
	case HeteroSlowOnly:
		return []boardSpec{slow}
	}
	return []boardSpec{fast, slow}
}

// heteroSeg is a span of a VM's run on one board.
type heteroSeg struct {
	board    string
	from, to time.Time
}

// runHeteroPhase runs one phase: a fresh host, o.VMs VM processes placed
// by it, o.Duration of load measured after the settling, the balancer on
// or off as the phase says; its summary, and its VMs' results added to
// rep.
func runHeteroPhase(ctx context.Context, o HeteroOptions, phase string, rep *HeteroReport) (HeteroPhase, error) {
	ph := HeteroPhase{Name: phase, Moves: []HeteroMove{}, Runs: []HeteroBoardRuns{}}
	bal := o.Balance
	bal.Policy = host.BalanceOff
	if phase == HeteroBalanced || phase == HeteroSlowFirst {
		bal.Policy, ph.Balance = host.BalanceLoad, true
	}
	specs := o.heteroSpecs(phase)
	for _, s := range specs {
		ph.Boards = append(ph.Boards, HeteroBoard{Name: s.name, Timing: s.timing.Name, DMABytesPerSec: s.timing.DMABytesPerSec})
	}
	mo := o.mobility()
	modes := mo.modes(o.VMs)
	o.progress("hetero: %s: boards %v, %d VMs (%v), balancer %s, %v of load", phase, ph.Boards, o.VMs, modes, bal.Policy, o.Duration)
	hh, err := newHeteroHost(ctx, o, specs, bal)
	if err != nil {
		return ph, err
	}
	if phase == HeteroSlowFirst {
		if err := hh.h.SetState(heteroFast, host.StateCordoned); err != nil {
			return ph, errors.Join(err, hh.close())
		}
	}
	vctx, cancel := context.WithCancel(ctx)
	vms, err := startMobilityVMs(vctx, mo, hh.ln.Addr(), "vm", modes)
	if err != nil {
		cancel()
		return ph, errors.Join(err, hh.close())
	}
	p := &phaseRun{m: hh.mobilityHost, vms: vms, cancel: cancel}
	if err := vms.open(ctx); err != nil {
		cancel()
		return ph, errors.Join(fmt.Errorf("start gate: %w", err), p.end(), vms.errsJoined())
	}
	opened := time.Now()
	ph.Start = hh.places(vms, modes)
	o.progress("hetero: %s: placed %s", phase, placesString(ph.Start))
	var mStart, mEnd, uncordon time.Time
	err = func() error {
		if err := sleep(ctx, o.settle()); err != nil {
			return err
		}
		mStart = time.Now()
		if phase == HeteroSlowFirst {
			if err := sleep(ctx, o.Duration/3); err != nil {
				return err
			}
			uncordon = time.Now()
			if err := hh.h.SetState(heteroFast, host.StateActive); err != nil {
				return err
			}
			o.progress("hetero: %s: board %s back in service", phase, heteroFast)
		}
		if err := sleep(ctx, time.Until(mStart.Add(o.Duration))); err != nil {
			return err
		}
		mEnd = time.Now()
		return nil
	}()
	ph.End = hh.places(vms, modes)
	hh.mu.Lock()
	looks := slices.Clone(hh.looks)
	if ph.Balance {
		ph.Looks = map[string]int{}
		for k, n := range hh.count {
			ph.Looks[k] = n
		}
		ph.MaxGap, ph.Loads = hh.maxGap, map[string]float64{}
		for b, sum := range hh.loads {
			ph.Loads[b] = sum / float64(max(hh.nLooks, 1))
		}
	}
	hh.mu.Unlock()
	if eerr := p.end(); err != nil || eerr != nil {
		return ph, errors.Join(err, eerr)
	}
	// The moves, each with the pause its source board reported (the
	// balancer moves one vGPU at a time, and nothing else moves here).
	recs := hh.pauses.of(aggregator.PauseMove)
	for _, l := range looks {
		mv := HeteroMove{AtNs: int64(l.Time.Sub(mStart)), VM: l.Name, VGPU: l.ID, From: l.From, To: l.To, Load: l.Load, Gap: l.Gap, Reason: l.Reason}
		if l.Outcome == host.LookFailed {
			mv.Failed = true
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: the balancer's move of %s from %s to %s failed: %s", phase, l.Name, l.From, l.To, l.Reason))
		} else if i := slices.IndexFunc(recs, func(r aggregator.Pause) bool { return r.VGPU == l.ID && r.FromBoard == l.From && r.ToBoard == l.To }); i >= 0 {
			r := recs[i]
			recs = slices.Delete(recs, i, i+1)
			mv.Bytes, mv.DowntimeNs, mv.CopyNs = r.Bytes, int64(r.Took), int64(r.Copy)
		}
		ph.Moves = append(ph.Moves, mv)
		o.progress("hetero: %s: moved %s (vGPU %d, load %.0f%%) %s → %s at %v: %.2f MiB in use, paused %v", phase, mv.VM, mv.VGPU, 100*mv.Load,
			mv.From, mv.To, time.Duration(mv.AtNs).Round(time.Millisecond), float64(mv.Bytes)/(1<<20), time.Duration(mv.DowntimeNs).Round(time.Microsecond))
	}

	// Each VM's spans on each board, from the gate to the end.
	segs := make([][]heteroSeg, len(vms.names))
	last := uncordon
	for i, name := range vms.names {
		cur := heteroSeg{board: ph.Start[i].Board, from: opened}
		for _, l := range looks {
			if l.Name != name || l.Outcome != host.LookMoved {
				continue
			}
			cur.to = l.Time
			segs[i] = append(segs[i], cur)
			cur = heteroSeg{board: l.To, from: l.Time}
			if l.Time.After(last) {
				last = l.Time
			}
		}
		cur.to = mEnd
		segs[i] = append(segs[i], cur)
	}
	ph.Whole = heteroRate(vms, segs, mStart, window{mStart, mEnd})
	if phase == HeteroSlowFirst {
		b := heteroRate(vms, segs, mStart, window{mStart, uncordon})
		ph.Before = &b
		ph.UncordonNs = int64(uncordon.Sub(mStart))
	}
	// The final placement: after the last change and a second of settling
	// (a moved VM's first runs on the new board), if a second is left.
	from := mStart
	if !last.IsZero() {
		from = later(from, last.Add(time.Second))
	}
	if mEnd.Sub(from) >= time.Second {
		f := heteroRate(vms, segs, mStart, window{from, mEnd})
		ph.Final = &f
	}
	ph.Runs = heteroBoardRuns(vms, segs, window{mStart, mEnd})

	var mrep MobilityReport
	vms.collect(&mrep, phase, nil)
	rep.Results = append(rep.Results, mrep.Results...)
	rep.VMList = append(rep.VMList, mrep.VMs...)
	rep.Problems = append(rep.Problems, mrep.Problems...)
	ph.Verified = len(mrep.Problems) == 0 && len(mrep.Results) > 0
	for _, name := range vms.names {
		ph.Verified = ph.Verified && vms.verified(name)
	}
	o.progress("hetero: %s: %.2f runs/s (%s), ended %s", phase, ph.Whole.Total, boardRatesString(ph.Whole), placesString(ph.End))
	return ph, nil
}

// heteroRate is the runs per second over w, in total, per board and per
// VM; a run counts on the board of the span it fell in, split by time.
func heteroRate(vms *mobilityVMs, segs [][]heteroSeg, mStart time.Time, w window) HeteroRate {
	r := HeteroRate{FromNs: int64(w.from.Sub(mStart)), Ns: int64(w.to.Sub(w.from)), Boards: map[string]float64{}, VMs: map[string]float64{}}
	secs := w.to.Sub(w.from).Seconds()
	if secs <= 0 {
		return r
	}
	for i, name := range vms.names {
		var n float64
		for _, s := range segs[i] {
			from, to := later(s.from, w.from), s.to
			if w.to.Before(to) {
				to = w.to
			}
			if !to.After(from) {
				continue
			}
			x := vms.runsIn(i, from, to)
			r.Boards[s.board] += x / secs
			n += x
		}
		r.VMs[name] = n / secs
		r.Total += n / secs
	}
	return r
}

// heteroBoardRuns is each board's runs per workload wholly within w and
// within one span on it, with their median time.
func heteroBoardRuns(vms *mobilityVMs, segs [][]heteroSeg, w window) []HeteroBoardRuns {
	type key struct{ board, workload string }
	times := map[key][]int64{}
	for i := range vms.names {
		for _, it := range vms.out[i].Iters {
			st, en := time.Unix(0, it.StartNs), time.Unix(0, it.EndNs)
			if st.Before(w.from) || en.After(w.to) {
				continue
			}
			for _, s := range segs[i] {
				if !st.Before(s.from) && !en.After(s.to) {
					k := key{s.board, it.Workload}
					times[k] = append(times[k], it.EndNs-it.StartNs)
				}
			}
		}
	}
	var out []HeteroBoardRuns
	for k, v := range times {
		med, _, _ := medianMinMax(v)
		out = append(out, HeteroBoardRuns{Board: k.board, Workload: k.workload, Runs: len(v), MedianNs: med})
	}
	slices.SortFunc(out, func(a, b HeteroBoardRuns) int {
		if a.Board != b.Board {
			return compareStrings(a.Board, b.Board)
		}
		return compareStrings(a.Workload, b.Workload)
	})
	if out == nil {
		out = []HeteroBoardRuns{}
	}
	return out
}

func compareStrings(a, b string) int { return cmp.Compare(a, b) }

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// placesString is "vm1→fast vm2→slow ...".
func placesString(ps []HeteroPlace) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += " "
		}
		s += p.VM + "→" + p.Board
	}
	return s
}

// boardRatesString is "fast 1.23, slow 0.45".
func boardRatesString(r HeteroRate) string {
	s := ""
	for _, b := range []string{heteroFast, heteroSlow} {
		if v, ok := r.Boards[b]; ok {
			if s != "" {
				s += ", "
			}
			s += fmt.Sprintf("%s %.2f", b, v)
		}
	}
	return s
}
