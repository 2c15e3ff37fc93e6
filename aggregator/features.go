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
	// PV: para-virtualization (GPUvm §4.1.3). The guest's GPU page tables
	// and BAR apertures are built by hypercalls (BAR5, package hypercall)
	// into tables the aggregator owns; nothing is scanned.
	PV bool
	// PVDRM: the guest has no GPU registers; the aggregator's pvdrm back
	// end drives the vGPU for it with its own driver (GPUvm §4.1.4), in
	// the PV driver mode (aggregator-owned page tables, nothing scanned).
	PVDRM bool
	// Pooling: pvdrm keeps closed mappable buffers for reuse (GEM pooling).
	Pooling bool
	// PollDoorbells: doorbells are found by polling the guest's user areas
	// instead of trapping (an aggregator option, not part of the mode).
	PollDoorbells bool
}

// modeFeatures maps the mode names to their features. The two PV modes
// differ only in the guest driver (one hypercall per update, or
// multicalls); both have BAR remap, which GPUvm's PV lacked for BAR1.
func modeFeatures() map[config.Mode]Features {
	return map[config.Mode]Features{
		config.ModeFVNaive:       {},
		config.ModeFVBARRemap:    {Remap: true},
		config.ModeFVLazy:        {Lazy: true},
		config.ModeFVOptimized:   {Lazy: true, Remap: true},
		config.ModeFVIncremental: {Lazy: true, Remap: true, Incremental: true},
		config.ModePVNaive:       {Remap: true, PV: true},
		config.ModePVMulticall:   {Remap: true, PV: true},
		config.ModePVDRM:         {PV: true, PVDRM: true},
		config.ModePVDRMPooling:  {PV: true, PVDRM: true, Pooling: true},
	}
}

// Modes lists the modes this aggregator serves, full virtualization in
// order of optimization then para-virtualization: the modes the
// configuration accepts (config.Modes), each of which has its features
// here (TestModesServed).
func Modes() []string { return config.ModeNames() }

// FeaturesFor returns the features of a mode.
func FeaturesFor(mode string) (Features, error) {
	f, ok := modeFeatures()[config.Mode(mode)]
	if !ok {
		return f, fmt.Errorf("mode %q is not served by this aggregator (have %v)", mode, Modes())
	}
	return f, nil
}

// IsServedMode reports whether the aggregator serves mode.
func IsServedMode(mode string) bool { return slices.Contains(Modes(), mode) }
