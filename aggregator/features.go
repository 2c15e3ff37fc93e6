package aggregator

import (
	"fmt"
	"slices"

	"github.com/gpuvm/gpuvm/config"
)

// Features are the GPUvm optimizations a vGPU runs with.
type Features struct {
	// Lazy shadowing: page tables are scanned when a channel is activated
	// (doorbell, FECS context bind, copy-engine bind) instead of at every
	// guest TLB flush (GPUvm §4.1.2).
	Lazy bool
	// Remap: the VM's non-sensitive BAR1/BAR3 aperture pages are mapped into
	// its device model so that accesses to them stop trapping; RAMIN,
	// page-table and doorbell pages stay trapped.
	Remap bool
	// Incremental shadowing: rescan only guest page-table pages written since
	// the last scan (beyond GPUvm).
	Incremental bool
	// PollDoorbells: doorbells are found by polling the guest's user areas
	// instead of trapping (an aggregator option, not part of the mode).
	PollDoorbells bool
}

// fvModes maps the full-virtualization mode names to their features.
func fvModes() map[config.Mode]Features {
	return map[config.Mode]Features{
		config.ModeFVNaive:       {},
		config.ModeFVBARRemap:    {Remap: true},
		config.ModeFVLazy:        {Lazy: true},
		config.ModeFVOptimized:   {Lazy: true, Remap: true},
		config.ModeFVIncremental: {Lazy: true, Remap: true, Incremental: true},
	}
}

// FVModes lists the full-virtualization modes in order of optimization:
// the modes the configuration accepts (config.Modes), each of which has
// its features here (TestModesServed).
func FVModes() []string { return config.ModeNames() }

// FeaturesFor returns the features of a full-virtualization mode.
func FeaturesFor(mode string) (Features, error) {
	f, ok := fvModes()[config.Mode(mode)]
	if !ok {
		return f, fmt.Errorf("mode %q is not served by this aggregator (have %v)", mode, FVModes())
	}
	return f, nil
}

// IsFVMode reports whether mode names a full-virtualization mode.
func IsFVMode(mode string) bool { return slices.Contains(FVModes(), mode) }
