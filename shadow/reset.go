package shadow

import "fmt"

// Reset empties the Manager for a vGPU that starts again (a function-level
// reset): every channel, space and PV object is closed and its shadow
// memory retired, as Close does; then the page tracker starts afresh (no
// watch survives, the BAR spaces' included: make new ones) and PV is off
// until EnablePV. What stays: the retired memory (free it with Reclaim),
// the budget and the counters, so the VM's scan counts stay monotonic.
// The Manager is then as NewManager returned it, except for those.
func (m *Manager) Reset() error {
	err := m.Close()
	if len(m.channels) != 0 || len(m.spaces) != 0 {
		return fmt.Errorf("shadow manager: reset: %d channels and %d spaces left open", len(m.channels), len(m.spaces))
	}
	m.tracker = NewTracker(m.tracker.trapUser)
	m.pv, m.pvm, m.pvNext = nil, nil, nil
	if err != nil {
		return fmt.Errorf("shadow manager: reset: %w", err)
	}
	return nil
}
