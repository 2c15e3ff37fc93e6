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
	Board string `json:"board"`
	State State  `json:"state"`
	Free  int    `json:"free_slots"`
	// Room is how many more vGPUs the board takes: its free slots, or
	// more on an overcommitted board (aggregator.Room).
	Room   int     `json:"room"`
	Load   float64 `json:"load"`   // share of GPU time used over the load window, 0..1
	Queued int     `json:"queued"` // submissions waiting now
	Weight int     `json:"weight"` // scheduling weight already placed
	// Excluded says why the board could not take the VM ("": it could).
	Excluded string `json:"excluded,omitempty"`
}

// Decision kinds: what made a decision.
const (
	// KindPlace is a VM placed as it connected (or refused).
	KindPlace = "place"
	// KindMove is a move the operator asked for, or a drain made.
	KindMove = "move"
	// KindBalance is a move the load balancer made (balance.go).
	KindBalance = "balance"
	// KindRestart is a parked vGPU of a lost board handed to another
	// board, restored there from its eviction image (restart.go).
	KindRestart = "restart"
)

// Decision is one placement: where a VM went, or why it went nowhere; or
// one move of a running vGPU to a board.
type Decision struct {
	Time time.Time `json:"time"`
	// Kind says what decided: KindPlace, KindMove, KindBalance or
	// KindRestart.
	Kind       string      `json:"kind"`
	DomID      uint32      `json:"domid"`
	Name       string      `json:"name"`
	Board      string      `json:"board,omitempty"` // "": refused
	Reason     string      `json:"reason"`
	Candidates []Candidate `json:"candidates"`
}

// Place chooses a board for g (nil if none can take it) and records the
// decision.
func (h *Host) Place(g aggregator.Guest) (*Board, Decision) {
	b, d := h.choose(g, h.pinOf(g, nil), nil)
	h.record(d)
	return b, d
}

// placeAvoiding is Place among the boards not in tried: those a VM found
// full when it attached, although placement had chosen them.
func (h *Host) placeAvoiding(g aggregator.Guest, tried map[*Board]bool) (*Board, Decision) {
	b, d := h.chooseExcept(g, h.pinOf(g, nil), func(b *Board) string {
		if tried[b] {
			return "found full when the VM attached"
		}
		return ""
	})
	h.record(d)
	return b, d
}

// choose is Place without recording; a board other than nil is excluded
// (the one a drain empties).
func (h *Host) choose(g aggregator.Guest, pin string, exclude *Board) (*Board, Decision) {
	return h.chooseExcept(g, pin, func(b *Board) string {
		if b == exclude {
			return "the board being drained"
		}
		return ""
	})
}

// pinOf is the board g is pinned to ("": none): Options.Pin with the
// profile of v, its running vGPU, or for a guest not attached yet (v nil)
// of the settings registered for its domain.
func (h *Host) pinOf(g aggregator.Guest, v *aggregator.VGPU) string {
	if h.opts.Pin == nil {
		return ""
	}
	profile := ""
	if v != nil {
		profile = v.Profile()
	} else {
		h.mu.Lock()
		profile = h.pending[g.DomID].Profile
		h.mu.Unlock()
	}
	return h.opts.Pin(g, profile)
}

// chooseExcept is choose with the boards excluded says why ("": none);
// pin is the board g is pinned to ("": none).
func (h *Host) chooseExcept(g aggregator.Guest, pin string, excluded func(*Board) string) (*Board, Decision) {
	states := h.states()
	loads := h.load.sample(h.boards, time.Now())
	d := Decision{Time: time.Now(), Kind: KindPlace, DomID: g.DomID, Name: g.Name}
	var fit []int
	for i, b := range h.boards {
		c := h.candidate(b, states[i], loads[i])
		switch {
		case excluded(b) != "":
			c.Excluded = excluded(b)
		case pin != "" && b.Name != pin:
			c.Excluded = fmt.Sprintf("the guest is pinned to board %q", pin)
		case c.State != StateActive:
			c.Excluded = "board is " + string(c.State)
		case c.Room == 0:
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
	c.Free = max(len(b.Agg.Layout().Slots)-used-len(b.Agg.OutOfService())-len(b.Agg.KeptSlots()), 0)
	c.Room = b.Agg.Room()
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
		h.log.Warn("placement refused", "kind", d.Kind, "domid", d.DomID, "name", d.Name, "reason", d.Reason)
	} else {
		h.log.Info("placed", "kind", d.Kind, "domid", d.DomID, "name", d.Name, "board", d.Board, "reason", d.Reason)
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

// loadMeter turns each vGPU's cumulative GPU time (its scheduler account)
// into the share of wall time it kept its board busy over the last
// loadWindow, and each board's load into the sum of its vGPUs' (at most 1).
// Placement compares the boards' figures, the balancer (balance.go) the
// boards' and their vGPUs'.
//
// Only the vGPUs on a board now count for it: one that detached or moved
// away takes its GPU time with it, and one that arrived counts from its new
// account (which starts at zero on attach and on a move), so a board's load
// follows what its tenants use now, not who used it before.
type loadMeter struct {
	mu      sync.Mutex
	samples [][]loadSample // by board, oldest first
}

type loadSample struct {
	at  time.Time
	gpu map[*aggregator.VGPU]time.Duration // each vGPU's GPU time then
}

// boardLoad is one board's figures over the window: its load and each of
// its vGPUs' (the same unit: a share of wall time, 0..1).
type boardLoad struct {
	load  float64
	vgpus map[*aggregator.VGPU]float64
}

func newLoadMeter(boards int) *loadMeter {
	return &loadMeter{samples: make([][]loadSample, boards)}
}

// sample records every board's GPU time at now and returns each board's
// load over the window ending now (0 until two samples span some time).
func (m *loadMeter) sample(boards []*Board, now time.Time) []float64 {
	ls := m.measure(boards, now)
	loads := make([]float64, len(ls))
	for i, l := range ls {
		loads[i] = l.load
	}
	return loads
}

// measure is sample with each vGPU's figure too.
func (m *loadMeter) measure(boards []*Board, now time.Time) []boardLoad {
	cur := make([]map[*aggregator.VGPU]time.Duration, len(boards))
	for i, b := range boards {
		cur[i] = map[*aggregator.VGPU]time.Duration{}
		for v, s := range b.Agg.SchedStats() {
			cur[i][v] = s.GPUTime
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]boardLoad, len(boards))
	for i := range boards {
		ss := append(m.samples[i], loadSample{now, cur[i]})
		// Keep one sample at or before the window's start, and the rest.
		for len(ss) > 2 && !ss[1].at.After(now.Add(-loadWindow)) {
			ss = ss[1:]
		}
		if len(ss) > 64 {
			ss = ss[len(ss)-64:]
		}
		m.samples[i] = ss
		out[i] = boardLoad{vgpus: make(map[*aggregator.VGPU]float64, len(cur[i]))}
		span := now.Sub(ss[0].at)
		if span <= 0 {
			continue
		}
		var sum time.Duration
		for v, gpu := range cur[i] {
			used := gpu - since(ss, v)
			sum += used
			out[i].vgpus[v] = min(float64(used)/float64(span), 1)
		}
		out[i].load = min(float64(sum)/float64(span), 1)
	}
	return out
}

// since is v's GPU time at the window's start: its figure in the oldest
// sample if it has been on the board, its account growing, in every sample
// since; 0 if it arrived (a new account) after one of them.
func since(ss []loadSample, v *aggregator.VGPU) time.Duration {
	next := ss[len(ss)-1].gpu[v]
	for j := len(ss) - 2; j >= 0; j-- {
		g, ok := ss[j].gpu[v]
		if !ok || g > next {
			return 0
		}
		next = g
	}
	return next
}
