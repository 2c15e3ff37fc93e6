package host

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// Placement policies (Options.Placement).
const (
	// PlaceSpread is the default, described below: load first.
	PlaceSpread = "spread"
	// PlacePack fills boards in configuration order (first fit): it keeps
	// later boards empty — for VMs that need a board to themselves, or to
	// power them down — at the price of the load spread gives.
	PlacePack = "pack"
)

// Placements lists the placement policies.
func Placements() []string { return []string{PlaceSpread, PlacePack} }

// Placement (PlaceSpread) chooses a board for each VM that connects, in order:
//
//  1. fit: the board is active (not cordoned) and has a free slot (every
//     board's slots are the same size, so a vGPU that fits one slot fits
//     any); a guest whose configuration pins a board gets that board or
//     nothing;
//  2. load: the least busy board — the share of its GPU time used over the
//     last loadWindow, compared in steps of loadStep so that measurement
//     noise does not decide between two equally idle boards;
//  3. queue: the fewest submissions waiting on the board now;
//  4. weight: the least scheduling weight already placed on the board (the
//     shares its scheduler has promised);
//  5. configuration order, so list the faster board first.
//
// Every decision, with the figures of every board it weighed, is logged and
// kept (the latest maxDecisions) for the control API (GET /v1/placements).
const (
	loadWindow   = 2 * time.Second
	loadStep     = 0.05
	maxDecisions = 64
	// sampleEvery is how often Serve samples each board's GPU time.
	sampleEvery = 250 * time.Millisecond
)

// Candidate is one board as a placement decision saw it.
type Candidate struct {
	Board  string  `json:"board"`
	State  State   `json:"state"`
	Free   int     `json:"free_slots"`
	Load   float64 `json:"load"`   // share of GPU time used over the load window, 0..1
	Queued int     `json:"queued"` // submissions waiting now
	Weight int     `json:"weight"` // scheduling weight already placed
	// Excluded says why the board could not take the VM ("": it could).
	Excluded string `json:"excluded,omitempty"`
}

// Decision is one placement: where a VM went, or why it went nowhere.
type Decision struct {
	Time       time.Time   `json:"time"`
	DomID      uint32      `json:"domid"`
	Name       string      `json:"name"`
	Board      string      `json:"board,omitempty"` // "": refused
	Reason     string      `json:"reason"`
	Candidates []Candidate `json:"candidates"`
}

// Place chooses a board for g (nil if none can take it) and records the
// decision.
func (h *Host) Place(g aggregator.Guest) (*Board, Decision) {
	b, d := h.choose(g, nil)
	h.record(d)
	return b, d
}

// choose is Place without recording; a board other than nil is excluded
// (the one a drain empties).
func (h *Host) choose(g aggregator.Guest, exclude *Board) (*Board, Decision) {
	pin := ""
	if h.opts.Pin != nil {
		pin = h.opts.Pin(g)
	}
	states := h.states()
	loads := h.load.sample(h.boards, time.Now())
	d := Decision{Time: time.Now(), DomID: g.DomID, Name: g.Name}
	var fit []int
	for i, b := range h.boards {
		c := h.candidate(b, states[i], loads[i])
		switch {
		case b == exclude:
			c.Excluded = "the board being drained"
		case pin != "" && b.Name != pin:
			c.Excluded = fmt.Sprintf("the guest is pinned to board %q", pin)
		case c.State != StateActive:
			c.Excluded = "board is " + string(c.State)
		case c.Free == 0:
			c.Excluded = "no free slot"
		default:
			fit = append(fit, i)
		}
		d.Candidates = append(d.Candidates, c)
	}
	if pin != "" && h.Board(pin) == nil {
		d.Reason = fmt.Sprintf("%s (domid %d) is pinned to board %q, which this host does not have (boards: %s)",
			g.Name, g.DomID, pin, strings.Join(h.names(), ", "))
		return nil, d
	}
	if len(fit) == 0 {
		var why []string
		for _, c := range d.Candidates {
			why = append(why, c.Board+": "+c.Excluded)
		}
		d.Reason = fmt.Sprintf("no board can take %s (domid %d): %s", g.Name, g.DomID, strings.Join(why, "; "))
		return nil, d
	}
	pack := h.opts.Placement == PlacePack
	slices.SortStableFunc(fit, func(x, y int) int {
		if pack {
			return cmp.Compare(x, y)
		}
		cx, cy := d.Candidates[x], d.Candidates[y]
		return cmp.Or(cmp.Compare(loadBucket(cx.Load), loadBucket(cy.Load)), cmp.Compare(cx.Queued, cy.Queued),
			cmp.Compare(cx.Weight, cy.Weight), cmp.Compare(x, y))
	})
	best := d.Candidates[fit[0]]
	d.Board = best.Board
	d.Reason = h.explain(best, fit, d.Candidates, pin, pack)
	return h.boards[fit[0]], d
}

// states returns each board's state: failed once its aggregator found it
// lost, else what the operator set.
func (h *Host) states() []State {
	h.mu.Lock()
	defer h.mu.Unlock()
	states := make([]State, len(h.boards))
	for i, b := range h.boards {
		states[i] = b.state
		if lost, _ := b.Agg.Lost(); lost {
			states[i] = StateFailed
		}
	}
	return states
}

// candidate reads one board's figures.
func (h *Host) candidate(b *Board, state State, load float64) Candidate {
	c := Candidate{Board: b.Name, State: state, Load: load}
	used := 0
	for _, s := range b.Agg.SchedStats() {
		c.Queued += s.Queued
		c.Weight += s.Weight
		used++
	}
	c.Free = max(len(b.Agg.Layout().Slots)-used-len(b.Agg.OutOfService()), 0)
	return c
}

// explain says why best won.
func (h *Host) explain(best Candidate, fit []int, all []Candidate, pin string, pack bool) string {
	fig := func(c Candidate) string {
		return fmt.Sprintf("%s (load %.0f%%, %d queued, weight %d, %d free)", c.Board, 100*c.Load, c.Queued, c.Weight, c.Free)
	}
	if pin != "" {
		return "pinned by its configuration: " + fig(best)
	}
	if len(fit) == 1 {
		return "the only board that fits: " + fig(best)
	}
	if pack {
		return fmt.Sprintf("the first of %d that fit (placement pack): %s", len(fit), fig(best))
	}
	var others []string
	for _, i := range fit[1:] {
		others = append(others, fig(all[i]))
	}
	return fmt.Sprintf("least loaded of %d that fit: %s; then %s", len(fit), fig(best), strings.Join(others, ", "))
}

func loadBucket(load float64) int { return int(load / loadStep) }

func (h *Host) names() []string {
	var out []string
	for _, b := range h.boards {
		out = append(out, b.Name)
	}
	return out
}

// record logs d and keeps it.
func (h *Host) record(d Decision) {
	if d.Board == "" {
		h.log.Warn("placement refused", "domid", d.DomID, "name", d.Name, "reason", d.Reason)
	} else {
		h.log.Info("placed", "domid", d.DomID, "name", d.Name, "board", d.Board, "reason", d.Reason)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.decisions) == maxDecisions {
		h.decisions = slices.Delete(h.decisions, 0, 1)
	}
	h.decisions = append(h.decisions, d)
}

// Decisions returns the latest placement decisions, oldest first.
func (h *Host) Decisions() []Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.decisions)
}

// loadMeter turns each board's cumulative GPU time (the sum of its vGPUs'
// scheduler accounts) into the share of wall time it was busy over the last
// loadWindow.
type loadMeter struct {
	mu      sync.Mutex
	samples [][]loadSample // by board, oldest first
}

type loadSample struct {
	at  time.Time
	gpu time.Duration
}

func newLoadMeter(boards int) *loadMeter {
	return &loadMeter{samples: make([][]loadSample, boards)}
}

// sample records every board's GPU time at now and returns each board's
// load over the window ending now (0 until two samples span some time).
// A vGPU that detached takes its GPU time with it: a board whose total
// fell counts as idle over that window.
func (m *loadMeter) sample(boards []*Board, now time.Time) []float64 {
	totals := make([]time.Duration, len(boards))
	for i, b := range boards {
		for _, s := range b.Agg.SchedStats() {
			totals[i] += s.GPUTime
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	loads := make([]float64, len(boards))
	for i := range boards {
		ss := append(m.samples[i], loadSample{now, totals[i]})
		// Keep one sample at or before the window's start, and the rest.
		for len(ss) > 2 && !ss[1].at.After(now.Add(-loadWindow)) {
			ss = ss[1:]
		}
		if len(ss) > 64 {
			ss = ss[len(ss)-64:]
		}
		m.samples[i] = ss
		first := ss[0]
		if span := now.Sub(first.at); span > 0 && totals[i] > first.gpu {
			loads[i] = min(float64(totals[i]-first.gpu)/float64(span), 1)
		}
	}
	return loads
}
