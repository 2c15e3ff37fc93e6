package host

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/sim"
)

// newTestHost builds a host of boards, each with slots vGPU slots of
// 128 MiB on a 512 MiB simulated board.
func newTestHost(t *testing.T, opts Options, slots ...int) *Host {
	t.Helper()
	return newTestHostWith(t, opts, nil, slots...)
}

// newTestHostWith is newTestHost with modify changing board i's aggregator
// options (nil: none).
func newTestHostWith(t *testing.T, opts Options, modify func(i int, o *aggregator.Options), slots ...int) *Host {
	t.Helper()
	reg := aggregator.NewRegistry()
	var boards []*Board
	for i, n := range slots {
		cfg := sim.DefaultConfig()
		cfg.VRAMSize, cfg.MemPartitions = 512<<20, 4
		board, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		name := []string{"fast", "slow", "third"}[i]
		o := aggregator.Options{MaxVMs: n, HealthInterval: 2 * time.Millisecond, Channels: cfg.Channels, Registry: reg, Board: i, BoardName: name,
			Partition: config.PartitionConfig{VRAMPerVM: 128 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 64 << 20},
			Weight:    func(g aggregator.Guest) int { return 1 + int(g.DomID)%10 }}
		if modify != nil {
			modify(i, &o)
		}
		agg, err := aggregator.New(board, o)
		if err != nil {
			t.Fatal(err)
		}
		boards = append(boards, &Board{Index: i, Name: name, Agg: agg, Release: board.Close, FailBus: board.FailBus, RepairBus: board.RepairBus})
	}
	h, err := New(reg, boards, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("host close: %v", err)
		}
	})
	return h
}

// attach places g as Serve would and attaches it on the chosen board.
func attach(t *testing.T, h *Host, domid uint32, name string) (*Board, *aggregator.VGPU, Decision) {
	t.Helper()
	return attachMode(t, h, domid, name, "fv-optimized")
}

// attachMode is attach in a mode.
func attachMode(t *testing.T, h *Host, domid uint32, name, mode string) (*Board, *aggregator.VGPU, Decision) {
	t.Helper()
	b, v, _, d := attachRAM(t, h, domid, name, mode, 16<<20)
	return b, v, d
}

// attachRAM is attachMode with ramSize bytes of guest RAM, which it returns
// (closed at the test's end).
func attachRAM(t *testing.T, h *Host, domid uint32, name, mode string, ramSize uint64) (*Board, *aggregator.VGPU, *hostmem.RAM, Decision) {
	t.Helper()
	g := aggregator.Guest{DomID: domid, Name: name, Mode: mode}
	b, d := h.Place(g)
	if b == nil {
		return nil, nil, nil, d
	}
	ram, err := hostmem.New(name, ramSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := b.Agg.Attach(g, f, ram.Size())
	if err != nil {
		t.Fatalf("attach on the placed board %s: %v", b.Name, err)
	}
	return b, v, ram, d
}

func TestPlacementSpreadsByWeightThenFit(t *testing.T) {
	h := newTestHost(t, Options{}, 2, 2)
	// Idle boards, nothing placed: configuration order.
	b, _, d := attach(t, h, 4, "a") // weight 5
	if b.Name != "fast" {
		t.Fatalf("first VM on %s, want fast (%s)", b.Name, d.Reason)
	}
	// fast now carries weight 5: the next goes to slow.
	b, _, d = attach(t, h, 1, "b") // weight 2
	if b.Name != "slow" || !strings.Contains(d.Reason, "least loaded of 2") {
		t.Fatalf("second VM on %s (%s), want slow", b.Name, d.Reason)
	}
	// slow carries 2 < 5: slow again, then it is full and fast takes the last.
	if b, _, d = attach(t, h, 2, "c"); b.Name != "slow" {
		t.Fatalf("third VM on %s (%s), want slow", b.Name, d.Reason)
	}
	if b, _, d = attach(t, h, 3, "d"); b.Name != "fast" || !strings.Contains(d.Reason, "the only board that fits") {
		t.Fatalf("fourth VM on %s (%s), want fast as the only fit", b.Name, d.Reason)
	}
	// Full host: refused, each board's reason given.
	if b, _, d = attach(t, h, 5, "e"); b != nil || !strings.Contains(d.Reason, "fast: no free slot") || !strings.Contains(d.Reason, "slow: no free slot") {
		t.Fatalf("fifth VM: board %v, reason %q", b, d.Reason)
	}
	if got := len(h.Decisions()); got != 5 {
		t.Fatalf("%d decisions kept, want 5", got)
	}
	ids := map[int]bool{}
	for _, v := range h.VGPUs() {
		if ids[v.ID] {
			t.Fatalf("vGPU id %d twice on one host", v.ID)
		}
		ids[v.ID] = true
	}
}

// TestPlacementPinByRegisteredProfile: a guest whose registered settings
// name a profile is pinned as that profile pins (Options.Pin is given the
// profile), before it has a vGPU.
func TestPlacementPinByRegisteredProfile(t *testing.T) {
	h := newTestHost(t, Options{Pin: func(_ aggregator.Guest, profile string) string {
		return map[string]string{"batch": "slow"}[profile]
	}}, 2, 2)
	h.mu.Lock()
	h.pending[5] = aggregator.DomainSettings{Profile: "batch"}
	h.mu.Unlock()
	if b, d := h.Place(aggregator.Guest{DomID: 5, Name: "registered"}); b == nil || b.Name != "slow" || !strings.Contains(d.Reason, "pinned") {
		t.Fatalf("a guest registered with a pinned profile placed on %v (%s)", b, d.Reason)
	}
	if b, _ := h.Place(aggregator.Guest{DomID: 6, Name: "other"}); b == nil || b.Name != "fast" {
		t.Fatalf("a guest without settings placed on %v, want fast (listed first, both idle)", b)
	}
}

func TestPlacementPinAndCordon(t *testing.T) {
	h := newTestHost(t, Options{Pin: func(g aggregator.Guest, _ string) string {
		return map[string]string{"pinned": "slow", "lost": "nowhere"}[g.Name]
	}}, 2, 2)
	if b, _, d := attach(t, h, 1, "pinned"); b == nil || b.Name != "slow" || !strings.Contains(d.Reason, "pinned") {
		t.Fatalf("pinned VM on %v (%s)", b, d.Reason)
	}
	if b, _, d := attach(t, h, 2, "lost"); b != nil || !strings.Contains(d.Reason, `pinned to board "nowhere", which this host does not have`) {
		t.Fatalf("VM pinned to a missing board: %v (%s)", b, d.Reason)
	}
	if err := h.SetState("fast", StateCordoned); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if b, _, d := attach(t, h, uint32(10+i), "free"+string(rune('a'+i))); i == 0 && (b == nil || b.Name != "slow") {
			t.Fatalf("with fast cordoned: %v (%s)", b, d.Reason)
		} else if i == 1 && (b != nil || !strings.Contains(d.Reason, "fast: board is cordoned")) {
			t.Fatalf("with fast cordoned and slow full: %v (%s)", b, d.Reason)
		}
	}
	if err := h.SetState("fast", StateActive); err != nil {
		t.Fatal(err)
	}
	if b, _, _ := attach(t, h, 20, "back"); b == nil || b.Name != "fast" {
		t.Fatalf("after uncordon: %v", b)
	}
	if err := h.SetState("nope", StateCordoned); err == nil {
		t.Fatal("cordoned a board that does not exist")
	}
}

func TestControlAPIAcrossBoards(t *testing.T) {
	h := newTestHost(t, Options{}, 1, 1)
	_, va, _ := attach(t, h, 1, "one")
	_, vb, _ := attach(t, h, 2, "two")
	srv := httptest.NewServer(h.ControlHandler())
	defer srv.Close()
	get := func(path string, v any) int {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if v != nil {
			if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode
	}
	var infos []aggregator.VGPUInfo
	get("/v1/vgpus", &infos)
	if len(infos) != 2 || infos[0].BoardName != "fast" || infos[1].BoardName != "slow" || infos[1].Board != 1 || infos[1].Slot != 0 {
		t.Fatalf("vgpus = %+v", infos)
	}
	var one aggregator.VGPUInfo
	if code := get("/v1/vgpus/"+itoa(vb.ID), &one); code != 200 || one.ID != vb.ID || one.BoardName != "slow" {
		t.Fatalf("vgpu %d on the second board: %d %+v", vb.ID, code, one)
	}
	var boards []BoardInfo
	get("/v1/boards", &boards)
	if len(boards) != 2 || boards[0].Used != 1 || boards[0].Free != 0 || boards[1].Name != "slow" || boards[1].State != StateActive {
		t.Fatalf("boards = %+v", boards)
	}
	if code := get("/v1/layout", nil); code != http.StatusBadRequest {
		t.Fatalf("/v1/layout on two boards: %d, want 400 naming /v1/boards/{name}/layout", code)
	}
	var l aggregator.Layout
	if code := get("/v1/boards/slow/layout", &l); code != 200 || len(l.Slots) != 1 {
		t.Fatalf("slow layout: %d %+v", code, l)
	}
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/v1/vgpus/"+itoa(va.ID), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(h.VGPUs()) != 1 {
		t.Fatalf("delete vGPU %d: %d, %d vGPUs left", va.ID, resp.StatusCode, len(h.VGPUs()))
	}
	if code := get("/v1/vgpus/99", nil); code != 404 {
		t.Fatalf("unknown vGPU: %d", code)
	}
	var types []aggregator.TypeInfo
	get("/v1/types", &types)
	if len(types) != 0 {
		t.Fatalf("types without profiles: %+v", types)
	}
}

func TestDomainSettingsHeldUntilPlaced(t *testing.T) {
	h := newTestHost(t, Options{}, 1, 1)
	if _, err := h.SetDomainSettings(7, aggregator.DomainSettings{Weight: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.SetDomainSettings(0, aggregator.DomainSettings{}); err == nil {
		t.Fatal("settings for domain 0 accepted")
	}
	for i := range 7 { // with domain 7's, the 8 that two slots allow
		if _, err := h.SetDomainSettings(uint32(100+i), aggregator.DomainSettings{}); err != nil {
			t.Fatalf("settings %d of 7 more: %v", i, err)
		}
	}
	if _, err := h.SetDomainSettings(200, aggregator.DomainSettings{}); err == nil {
		t.Fatal("more settings waiting than four per slot of the host")
	}
	s, ok := h.takePending(7)
	if !ok || s.Weight != 3 {
		t.Fatalf("pending for 7: %+v %v", s, ok)
	}
	h.ForgetDomain(100)
	if _, ok := h.takePending(100); ok {
		t.Fatal("forgotten settings still held")
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestFailedBoardLeavesPlacement(t *testing.T) {
	h := newTestHost(t, Options{FaultInjection: true}, 2, 2)
	_, onFast, _ := attach(t, h, 1, "on-fast")
	srv := httptest.NewServer(h.ControlHandler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/boards/fast/fail", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("fail fast: %s", resp.Status)
	}
	deadline := time.Now().Add(time.Minute) // a hang guard
	for lost, _ := onFast.Lost(); !lost; lost, _ = onFast.Lost() {
		if time.Now().After(deadline) {
			t.Fatal("the failed board was never found lost")
		}
		time.Sleep(time.Millisecond)
	}
	infos := h.BoardInfos()
	if infos[0].State != StateFailed || !strings.Contains(infos[0].Lost, "fell off the bus") || infos[1].State != StateActive {
		t.Fatalf("boards after the failure: %+v", infos)
	}
	if b, _, d := attach(t, h, 2, "next"); b == nil || b.Name != "slow" || !strings.Contains(d.Candidates[0].Excluded, "failed") {
		t.Fatalf("placement after the failure: %v (%+v)", b, d)
	}
	if err := h.SetState("fast", StateActive); err == nil {
		t.Fatal("a failed board was uncordoned")
	}
}

func TestFaultInjectionOffByDefault(t *testing.T) {
	h := newTestHost(t, Options{}, 1)
	srv := httptest.NewServer(h.ControlHandler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/boards/fast/fail", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("fault injection without the option: %s", resp.Status)
	}
	if lost, _ := h.Board("fast").Agg.Lost(); lost {
		t.Fatal("the board failed anyway")
	}
}

func TestPlacementPack(t *testing.T) {
	h := newTestHost(t, Options{Placement: PlacePack}, 2, 2)
	want := []string{"fast", "fast", "slow"}
	for i, w := range want {
		b, _, d := attach(t, h, uint32(i+1), "p"+itoa(i))
		if b == nil || b.Name != w {
			t.Fatalf("VM %d on %v (%s), want %s", i, b, d.Reason, w)
		}
		if i == 0 && !strings.Contains(d.Reason, "placement pack") {
			t.Errorf("reason %q does not name the policy", d.Reason)
		}
	}
	if _, err := New(aggregator.NewRegistry(), h.boards, Options{Placement: "random"}); err == nil {
		t.Error("an unknown placement was accepted")
	}
}

func TestDrain(t *testing.T) {
	h := newTestHost(t, Options{Pin: func(g aggregator.Guest, _ string) string {
		return map[string]string{"pinned": "fast"}[g.Name]
	}}, 3, 2, 2)
	// Three VMs on fast (pack them there by cordoning the others), one PV.
	for _, other := range []string{"slow", "third"} {
		if err := h.SetState(other, StateCordoned); err != nil {
			t.Fatal(err)
		}
	}
	_, a, _ := attach(t, h, 1, "a")
	_, pv, _ := attachMode(t, h, 2, "pv", "pv-multicall")
	_, pinned, _ := attach(t, h, 3, "pinned")
	for _, other := range []string{"slow", "third"} {
		if err := h.SetState(other, StateActive); err != nil {
			t.Fatal(err)
		}
	}
	res, err := h.Drain(context.Background(), "fast")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	movedOff := map[int]bool{}
	for _, m := range res.Moved {
		movedOff[m.ID] = m.FromBoard == "fast" && m.ToBoard != "fast"
	}
	if len(res.Moved) != 2 || !movedOff[a.ID] || !movedOff[pv.ID] {
		t.Errorf("moved %+v, want vGPUs %d and %d (PV), off fast", res.Moved, a.ID, pv.ID)
	}
	left := map[int]string{}
	for _, l := range res.Left {
		left[l.ID] = l.Reason
	}
	if !strings.Contains(left[pinned.ID], "pinned to board fast") {
		t.Errorf("the pinned vGPU left with %q", left[pinned.ID])
	}
	if st := h.states()[0]; st != StateCordoned {
		t.Errorf("fast is %s after its drain, want cordoned", st)
	}
	if b, _, d := attach(t, h, 4, "new"); b == nil || b.Name == "fast" {
		t.Errorf("a new VM after the drain went to %v (%s)", b, d.Reason)
	}
	if _, err := h.Drain(context.Background(), "nope"); err == nil {
		t.Error("drained a board that does not exist")
	}
}
