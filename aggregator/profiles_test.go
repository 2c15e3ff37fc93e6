package aggregator

import (
	"strings"
	"testing"
)

// TestProfileSizesVGPU: a domain whose settings name a profile gets a vGPU
// of the profile's sizes — VRAM, channels, aperture slices and weight —
// every workload verifies in it, and the types list counts one slot less.
func TestProfileSizesVGPU(t *testing.T) {
	quarter := Profile{Name: "quarter", VRAM: 64 << 20, Channels: 2, BAR1: 4 << 20, BAR3: 1 << 20, Weight: 3}
	agg, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Profiles: []Profile{quarter,
		{Name: "huge", VRAM: 1 << 30, Channels: 2, BAR1: 4 << 20, BAR3: 1 << 20, Weight: 1}}})
	if got := agg.Types(); len(got) != 2 || got[0].Available != 2 || got[1].Available != 0 {
		t.Fatalf("types before = %+v, want quarter available 2, huge (bigger than a slot) 0", got)
	}
	err := agg.SetDomainSettings(7, DomainSettings{Profile: "nope"})
	if err == nil || !strings.Contains(err.Error(), `no vGPU profile "nope" (have quarter, huge`) {
		t.Errorf("unknown profile: err = %v", err)
	}
	// The settings' own channel count wins over the profile's.
	if err := agg.SetDomainSettings(7, DomainSettings{Profile: "quarter", Channels: 1}); err != nil {
		t.Fatal(err)
	}
	g := startGuestAs(t, agg, 7, "vm1", "fv-optimized")
	s := g.v.Slot
	if s.VRAM.Size != 64<<20 || s.Chans != 1 || s.BAR1.Size != 4<<20 || s.BAR3.Size != 1<<20 {
		t.Errorf("slot = %+v, want the profile's sizes with 1 channel", s)
	}
	if got := g.dev.VRAMSize(); got != 64<<20 {
		t.Errorf("guest sees %d MiB of VRAM, want 64", got>>20)
	}
	if w := g.v.SchedStats().Weight; w != 3 {
		t.Errorf("weight %d, want the profile's 3", w)
	}
	if info := g.v.Info(); info.Profile != "quarter" || info.BAR1Bytes != 4<<20 {
		t.Errorf("info profile %q bar1 %d", info.Profile, info.BAR1Bytes)
	}
	runAllWorkloads(t, g, "fv-optimized")
	if got := agg.Types(); got[0].Available != 1 {
		t.Errorf("types with one vGPU attached = %+v, want quarter available 1", got)
	}
	// A para-virtualized guest in the narrowed slot too.
	if err := agg.SetDomainSettings(8, DomainSettings{Profile: "quarter"}); err != nil {
		t.Fatal(err)
	}
	pv := startGuestAs(t, agg, 8, "vm2", "pv-multicall")
	if pv.v.Slot.BAR3.Size != 1<<20 || pv.v.Slot.Chans != 2 {
		t.Errorf("pv slot = %+v", pv.v.Slot)
	}
	runAllWorkloads(t, pv, "pv-multicall")
	if got := agg.Types(); got[0].Available != 0 {
		t.Errorf("types with both slots taken = %+v, want quarter available 0", got)
	}
}

// TestDomainSettingsBounds: what a profile fills in is checked as what a
// toolstack sends is (a weight past the bound would overflow the credit
// policies' period × weight), and a VRAM size must be whole MiB.
func TestDomainSettingsBounds(t *testing.T) {
	agg, _ := newTestAggregatorWith(t, Options{MaxVMs: 1, Profiles: []Profile{{Name: "heavy", Weight: 1 << 40}}})
	if err := agg.SetDomainSettings(3, DomainSettings{Profile: "heavy"}); err == nil || !strings.Contains(err.Error(), "weight") {
		t.Errorf("a profile's huge weight: err = %v", err)
	}
	if err := agg.SetDomainSettings(3, DomainSettings{VRAM: 1}); err == nil || !strings.Contains(err.Error(), "multiple of 1MiB") {
		t.Errorf("vram 1: err = %v", err)
	}
}
