package shadow

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// TestManagerReset: after Reset the manager holds nothing — no channel,
// space, PV object or tracked page — and once reclaimed no shadow byte;
// its counters stay; it serves a new channel as a fresh manager would.
func TestManagerReset(t *testing.T) {
	e := newEnv(t)
	buildGuest(e)
	m := newManager(t, e, 0)
	e.writeRAMIN(gRAMIN, gPD, gUser, 0x12_3456_7000, 10, nvc0.VASize-1)
	c, err := m.OpenChannel(gRAMIN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Activate(); err != nil {
		t.Fatal(err)
	}
	m.EnablePV(PVLimits{Objects: 16, Bindings: 4}) // and a PV object beside the channel
	if _, err := m.PVAlloc(PVPageDir); err != nil {
		t.Fatal(err)
	}
	scans := m.Counters().FullScans
	if err := m.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := m.Reclaim(nil); err != nil {
		t.Fatal(err)
	}
	if m.NumSpaces() != 0 || m.PVObjects() != 0 || m.PV() || m.Tracker().Pages() != 0 || m.ShadowBytes() != 0 {
		t.Errorf("after reset: %d spaces, %d PV objects (PV %v), %d tracked pages, %d shadow bytes",
			m.NumSpaces(), m.PVObjects(), m.PV(), m.Tracker().Pages(), m.ShadowBytes())
	}
	if got := m.Counters().FullScans; got != scans {
		t.Errorf("full scans %d after reset, want the %d from before", got, scans)
	}
	c, err = m.OpenChannel(gRAMIN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Activate(); err != nil || !c.Valid() {
		t.Fatalf("a channel after the reset: %v %v", err, c.Err())
	}
	diffViews(t, e.walk(t, c.Space().ShadowPD()), e.expected(gPD))
}
