package host

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
)

// Load balancing by moves (Becchi et al.'s dynamic binding: a task bound to
// an overloaded GPU is re-bound to an idle or faster one). With
// BalanceLoad, a goroutine of the Host looks at the boards every
// BalanceOptions.Interval:
//
//  1. the busiest active board (the source) and the least loaded active
//     board with a free slot (the target), by the load placement measures
//     (the share of its GPU time its vGPUs used over loadWindow; ties go to
//     configuration order, so the faster board listed first wins);
//  2. their gap (source load − target load) must be above Threshold at two
//     consecutive looks with the same source and target, and no move may
//     have happened within the last loadWindow (the figures must have seen
//     the boards as they are after it);
//  3. the vGPU to move is the one on the source whose own load s best fits:
//     the move leaves a gap of |gap − 2s|, which shrinks only if
//     0 < s < gap; the fit leaving the smallest gap wins. A vGPU that
//     cannot move is skipped: a guest pinned to a board, one moved (or
//     whose move failed) within the last Hold;
//  4. the move is Host.move, the one path the operator's moves and drains
//     take, recorded with the placement decisions (kind "balance").
//
// Hysteresis is 2 and 3: a gap must persist, a move must be predicted to
// shrink it, and a moved vGPU stays where it went for Hold, so vGPUs do not
// bounce between boards whose loads swing. Every look is logged and kept
// (the latest maxLooks, a run of alike looks as one) for GET /v1/balance.

// Balance policies (BalanceOptions.Policy), as [daemon] balance names them.
const (
	// BalanceOff ("" too) moves nothing.
	BalanceOff = config.BalanceOff
	// BalanceLoad moves vGPUs from the busiest board to the least loaded.
	BalanceLoad = config.BalanceLoad
)

// BalancePolicies lists the balance policies.
func BalancePolicies() []string { return []string{BalanceOff, BalanceLoad} }

// Balancer defaults: the configuration's ([daemon] balance_interval,
// balance_threshold, balance_hold).
const (
	DefaultBalanceInterval  = config.DefaultBalanceInterval
	DefaultBalanceThreshold = config.DefaultBalanceThreshold
	DefaultBalanceHold      = config.DefaultBalanceHold
)

// maxLooks bounds the balancer's record of looks.
const maxLooks = 64

// BalanceOptions configure the load balancer (Options.Balance).
type BalanceOptions struct {
	// Policy is BalanceOff ("" too) or BalanceLoad.
	Policy string
	// Interval is how often it looks (0: DefaultBalanceInterval).
	Interval time.Duration
	// Threshold is the load gap between the busiest and the least loaded
	// active board, as a share of a board's time (0..1), above which it
	// moves (0: DefaultBalanceThreshold).
	Threshold float64
	// Hold is how long a vGPU it moved, or failed to move, is left alone
	// (0: DefaultBalanceHold).
	Hold time.Duration
	// Now is the clock holds and the settling after a move are measured
	// on (nil: time.Now). Loads are always measured on the wall clock the
	// boards' GPU time is.
	Now func() time.Time
	// Looked, when set, is called with every look after it is recorded
	// (tests follow the balancer with it).
	Looked func(BalanceLook)
}

// Balance outcomes (BalanceLook.Outcome).
const (
	// LookBalanced: no gap above the threshold, or no board to move to.
	LookBalanced = "balanced"
	// LookWaiting: a gap above the threshold, seen for the first time, or
	// seen while the figures settle after a move.
	LookWaiting = "waiting"
	// LookStuck: a gap that persisted, but no vGPU on the busiest board
	// can move or would shrink it.
	LookStuck = "stuck"
	// LookMoved: a vGPU was moved.
	LookMoved = "moved"
	// LookFailed: the move was tried and failed.
	LookFailed = "failed"
)

// BalanceLook is one look of the balancer: what it saw and did.
type BalanceLook struct {
	// Time is the look's (the last of a run of alike looks); Repeats
	// counts the looks after the first that the run holds.
	Time    time.Time `json:"time"`
	Repeats int       `json:"repeats,omitempty"`
	Outcome string    `json:"outcome"`
	// From and To are the busiest and the least loaded active boards with
	// a free slot; Gap the difference of their loads.
	From string  `json:"from,omitempty"`
	To   string  `json:"to,omitempty"`
	Gap  float64 `json:"gap"`
	// ID, Name and Load are the vGPU it chose (with LookMoved and
	// LookFailed) and its own load.
	ID     int     `json:"id,omitempty"`
	Name   string  `json:"name,omitempty"`
	Load   float64 `json:"vgpu_load,omitempty"`
	Reason string  `json:"reason"`
	// Boards are every board's figures at the look.
	Boards []Candidate `json:"boards"`
}

// alike reports whether l repeats p (a run of them is kept as one).
func (l BalanceLook) alike(p BalanceLook) bool {
	return l.Outcome == p.Outcome && l.From == p.From && l.To == p.To && l.ID == p.ID &&
		l.Outcome != LookMoved && l.Outcome != LookFailed
}

// BalanceHeld is a vGPU the balancer leaves alone until Until.
type BalanceHeld struct {
	ID    int       `json:"id"`
	Name  string    `json:"name"`
	Until time.Time `json:"until"`
}

// BalanceStatus is the balancer as the control API reports it (GET
// /v1/balance).
type BalanceStatus struct {
	Policy     string        `json:"policy"`
	IntervalNs int64         `json:"interval_ns,omitempty"`
	Threshold  float64       `json:"threshold,omitempty"`
	HoldNs     int64         `json:"hold_ns,omitempty"`
	Moves      uint64        `json:"moves"`
	Held       []BalanceHeld `json:"held"`
	Looks      []BalanceLook `json:"looks"`
}

// balancer is the Host's load balancer: its settings, the hysteresis state
// and the record of its looks.
type balancer struct {
	opts BalanceOptions
	stop context.CancelFunc // nil: not running
	done chan struct{}

	mu      sync.Mutex
	streak  [2]string // the source and target a gap above the threshold was last seen between ("": none)
	settle  time.Time // no move before this: the figures settle after the last one
	held    map[*aggregator.VGPU]time.Time
	looks   []BalanceLook
	moves   uint64
	lastOut string
}

// newBalancer checks and fills o.
func newBalancer(o BalanceOptions) (*balancer, error) {
	switch o.Policy {
	case "":
		o.Policy = BalanceOff
	case BalanceOff, BalanceLoad:
	default:
		return nil, fmt.Errorf("host: unknown balance policy %q (have %v)", o.Policy, BalancePolicies())
	}
	if o.Interval < 0 || o.Hold < 0 || o.Threshold < 0 || o.Threshold >= 1 {
		return nil, fmt.Errorf("host: balance interval %v, threshold %v, hold %v: want interval and hold ≥ 0 and 0 ≤ threshold < 1",
			o.Interval, o.Threshold, o.Hold)
	}
	o.Interval = cmp.Or(o.Interval, DefaultBalanceInterval)
	o.Threshold = cmp.Or(o.Threshold, DefaultBalanceThreshold)
	o.Hold = cmp.Or(o.Hold, DefaultBalanceHold)
	if o.Now == nil {
		o.Now = time.Now
	}
	return &balancer{opts: o, held: map[*aggregator.VGPU]time.Time{}}, nil
}

// startBalancer starts the balancer's goroutine (with BalanceLoad); Close
// stops it before it closes the boards.
func (h *Host) startBalancer() {
	if h.bal.opts.Policy != BalanceLoad {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	h.bal.stop, h.bal.done = stop, make(chan struct{})
	h.log.Info("load balancer on", "interval", h.bal.opts.Interval, "threshold", h.bal.opts.Threshold, "hold", h.bal.opts.Hold)
	go func() {
		defer close(h.bal.done)
		t := time.NewTicker(h.bal.opts.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				h.balanceOnce(ctx)
			}
		}
	}()
}

// stopBalancer stops the balancer and waits for it (a move in progress is
// cut short by its context: it changes nothing, or completes).
func (h *Host) stopBalancer() {
	if h.bal.stop == nil {
		return
	}
	h.bal.stop()
	<-h.bal.done
}

// balanceView is what one look sees of a board.
type balanceView struct {
	board *Board
	cand  Candidate
	vgpus []balanceVGPU
}

// balanceVGPU is one vGPU as a look sees it.
type balanceVGPU struct {
	v    *aggregator.VGPU
	load float64
	// why it cannot move ("": it can).
	why string
}

// balanceOnce is one look: measure, decide, move if the decision is to.
func (h *Host) balanceOnce(ctx context.Context) {
	views := h.balanceViews()
	look, v, to := h.bal.decide(views, h.bal.opts.Now())
	if v != nil {
		mctx, cancel := context.WithTimeout(ctx, moveTimeout)
		by := "the load balancer (" + look.Reason + ")"
		res, err := h.move(mctx, v.ID, to.board.Name, KindBalance, by)
		cancel()
		h.bal.moved(v, err == nil, h.bal.opts.Now())
		if err != nil {
			look.Outcome = LookFailed
			look.Reason = fmt.Sprintf("moving vGPU %d (%s) from board %s to %s failed: %v; it is left alone for %v",
				v.ID, v.Guest.Name, look.From, look.To, err, h.bal.opts.Hold)
		} else {
			look.Reason = fmt.Sprintf("%s; moved to slot %d (%d KiB copied, paused %v)", look.Reason, res.ToSlot,
				res.BytesCopied>>10, time.Duration(res.DowntimeNs).Round(time.Microsecond))
		}
	}
	h.bal.keep(look)
	h.logLook(look)
	if h.bal.opts.Looked != nil {
		h.bal.opts.Looked(look)
	}
}

// balanceViews measures every board and its vGPUs, with why each vGPU
// cannot move.
func (h *Host) balanceViews() []balanceView {
	states := h.states()
	loads := h.load.measure(h.boards, time.Now())
	views := make([]balanceView, len(h.boards))
	for i, b := range h.boards {
		views[i] = balanceView{board: b, cand: h.candidate(b, states[i], loads[i].load)}
		vs := b.Agg.VGPUs()
		slices.SortFunc(vs, func(x, y *aggregator.VGPU) int { return x.ID - y.ID })
		for _, v := range vs {
			bv := balanceVGPU{v: v, load: loads[i].vgpus[v]}
			if _, err := aggregator.FeaturesFor(v.Guest.Mode); err != nil {
				bv.why = fmt.Sprintf("mode %s cannot move", v.Guest.Mode)
			} else if pin := h.pinOf(v.Guest, v); pin != "" {
				bv.why = fmt.Sprintf("pinned to board %s", pin)
			}
			views[i].vgpus = append(views[i].vgpus, bv)
		}
	}
	return views
}

// decide is one look's decision over views at now (the balancer's clock):
// the look, and the vGPU to move and where (nil: none). It updates the
// hysteresis state.
func (bl *balancer) decide(views []balanceView, now time.Time) (BalanceLook, *aggregator.VGPU, *balanceView) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	for v, until := range bl.held {
		if !now.Before(until) {
			delete(bl.held, v)
		}
	}
	look := BalanceLook{Time: now}
	for _, bv := range views {
		look.Boards = append(look.Boards, bv.cand)
	}
	var src, dst *balanceView
	for i := range views {
		bv := &views[i]
		if bv.cand.State != StateActive {
			continue
		}
		if src == nil || bv.cand.Load > src.cand.Load {
			src = bv
		}
	}
	for i := range views {
		bv := &views[i]
		if bv == src || bv.cand.State != StateActive || bv.cand.Free == 0 {
			continue
		}
		if dst == nil || bv.cand.Load < dst.cand.Load {
			dst = bv
		}
	}
	if src == nil || dst == nil {
		bl.streak = [2]string{}
		look.Outcome, look.Reason = LookBalanced, "no active board with a free slot to move to"
		return look, nil, nil
	}
	look.From, look.To = src.board.Name, dst.board.Name
	look.Gap = max(src.cand.Load-dst.cand.Load, 0)
	th := bl.opts.Threshold
	if look.Gap <= th {
		bl.streak = [2]string{}
		look.Outcome = LookBalanced
		look.Reason = fmt.Sprintf("gap %.0f%% between board %s (%.0f%%) and %s (%.0f%%) is within the threshold %.0f%%",
			100*look.Gap, look.From, 100*src.cand.Load, look.To, 100*dst.cand.Load, 100*th)
		return look, nil, nil
	}
	gap := fmt.Sprintf("gap %.0f%% between board %s (%.0f%%) and %s (%.0f%%) is above the threshold %.0f%%",
		100*look.Gap, look.From, 100*src.cand.Load, look.To, 100*dst.cand.Load, 100*th)
	if now.Before(bl.settle) {
		bl.streak = [2]string{}
		look.Outcome = LookWaiting
		look.Reason = fmt.Sprintf("%s, but the last move was less than %v ago: the loads settle first", gap, loadWindow)
		return look, nil, nil
	}
	pair := [2]string{look.From, look.To}
	if bl.streak != pair {
		bl.streak = pair
		look.Outcome = LookWaiting
		look.Reason = gap + " for the first time: a move needs it at the next look too"
		return look, nil, nil
	}
	var best *balanceVGPU
	var why []string
	for i := range src.vgpus {
		c := &src.vgpus[i]
		name := fmt.Sprintf("vGPU %d (%s)", c.v.ID, c.v.Guest.Name)
		switch until, held := bl.held[c.v]; {
		case c.why != "":
			why = append(why, name+": "+c.why)
		case held:
			why = append(why, fmt.Sprintf("%s: moved within the hold, left alone until %s", name, until.Format(time.TimeOnly)))
		case c.load <= 0:
			why = append(why, name+": idle, moving it changes nothing")
		case c.load >= look.Gap:
			why = append(why, fmt.Sprintf("%s: its load %.0f%% is not below the gap, moving it would not shrink it", name, 100*c.load))
		case best == nil || remaining(look.Gap, c.load) < remaining(look.Gap, best.load):
			best = c
		}
	}
	if best == nil {
		look.Outcome = LookStuck
		if len(why) == 0 {
			why = append(why, "it has no vGPU")
		}
		look.Reason = fmt.Sprintf("%s, but nothing on board %s can move: %s", gap, look.From, strings.Join(why, "; "))
		return look, nil, nil
	}
	bl.streak = [2]string{}
	look.Outcome, look.ID, look.Name, look.Load = LookMoved, best.v.ID, best.v.Guest.Name, best.load
	look.Reason = fmt.Sprintf("%s at two looks: vGPU %d (%s, load %.0f%%) moves from board %s to %s, leaving a gap of %.0f%%",
		gap, best.v.ID, best.v.Guest.Name, 100*best.load, look.From, look.To, 100*remaining(look.Gap, best.load))
	return look, best.v, dst
}

// remaining is the gap a move of a vGPU of load s leaves of gap, boards of
// one speed assumed (a faster target only shrinks it more).
func remaining(gap, s float64) float64 {
	if r := gap - 2*s; r > 0 {
		return r
	}
	return 2*s - gap
}

// moved holds v after a move (ok) or a failed one, and starts the settling.
func (bl *balancer) moved(v *aggregator.VGPU, ok bool, now time.Time) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	bl.held[v] = now.Add(bl.opts.Hold)
	if ok {
		bl.moves++
		bl.settle = now.Add(loadWindow)
	}
}

// keep records look, folding it into the last one when alike.
func (bl *balancer) keep(look BalanceLook) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	if n := len(bl.looks); n > 0 && look.alike(bl.looks[n-1]) {
		look.Repeats = bl.looks[n-1].Repeats + 1
		bl.looks[n-1] = look
		return
	}
	if len(bl.looks) == maxLooks {
		bl.looks = slices.Delete(bl.looks, 0, 1)
	}
	bl.looks = append(bl.looks, look)
}

// logLook logs a look: moves and failures at info and warn, a change of
// outcome at info, the rest at debug.
func (h *Host) logLook(l BalanceLook) {
	h.bal.mu.Lock()
	changed := l.Outcome != h.bal.lastOut
	h.bal.lastOut = l.Outcome
	h.bal.mu.Unlock()
	level := slog.LevelDebug
	switch {
	case l.Outcome == LookFailed:
		level = slog.LevelWarn
	case l.Outcome == LookMoved, changed:
		level = slog.LevelInfo
	}
	h.log.Log(context.Background(), level, "load balancer", "outcome", l.Outcome, "from", l.From, "to", l.To,
		"gap", l.Gap, "vgpu", l.ID, "reason", l.Reason)
}

// BalanceStatus returns the balancer's settings, moves, holds and latest
// looks, oldest first.
func (h *Host) BalanceStatus() BalanceStatus {
	bl := h.bal
	bl.mu.Lock()
	defer bl.mu.Unlock()
	st := BalanceStatus{Policy: bl.opts.Policy, Moves: bl.moves, Held: []BalanceHeld{}, Looks: slices.Clone(bl.looks)}
	if st.Looks == nil {
		st.Looks = []BalanceLook{}
	}
	if bl.opts.Policy == BalanceOff {
		return st
	}
	st.IntervalNs, st.Threshold, st.HoldNs = int64(bl.opts.Interval), bl.opts.Threshold, int64(bl.opts.Hold)
	now := bl.opts.Now()
	for v, until := range bl.held {
		if now.Before(until) {
			st.Held = append(st.Held, BalanceHeld{ID: v.ID, Name: v.Guest.Name, Until: until})
		}
	}
	slices.SortFunc(st.Held, func(x, y BalanceHeld) int { return x.ID - y.ID })
	return st
}

// BalanceMoves counts the moves the balancer made (metrics).
func (h *Host) BalanceMoves() uint64 {
	h.bal.mu.Lock()
	defer h.bal.mu.Unlock()
	return h.bal.moves
}

// serveBalance answers GET /v1/balance.
func (h *Host) serveBalance(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, h.BalanceStatus())
}
