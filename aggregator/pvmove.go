package aggregator

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/shadow"
)

// Carrying a PV vGPU's aggregator-owned state through a move or an
// eviction. A PV guest's page tables and apertures are not in its slice:
// the aggregator built them in its reserve from the guest's hypercalls.
// Before the vGPU leaves a board they are described in the guest's terms
// (handles, the guest entries each table was given, links, bindings,
// aperture entries: shadow.PVExport); on the new slot they are built again
// through the calls the hypercalls make, each entry translated and checked
// against the new slice and RAM registration. A pvdrm vGPU is a PV vGPU
// driven by the back end's driver, whose state is all in the guest's terms
// too (its buffers are addresses of the vGPU's VRAM and RAM), so it moves
// the same way; only the back end's wake-up hook has to follow it to the
// new board's dispatcher (rewireEnded).

// pvImage is a PV vGPU's aggregator-owned state in guest terms.
type pvImage struct {
	tables *shadow.PVState
	bars   [2][]uint64 // BAR1, BAR3 aperture entries
}

// exportPV describes v's PV objects and apertures (nil for an FV vGPU).
// Called with v.mu held and v's channels stopped, before its shadows go.
func (v *VGPU) exportPV() (*pvImage, error) {
	if !v.feat.PV {
		return nil, nil
	}
	tables, err := v.shadows.PVExport()
	if err != nil {
		return nil, err
	}
	img := &pvImage{tables: tables}
	for i, b := range v.bars {
		if img.bars[i], err = b.sp.PVExport(); err != nil {
			return nil, fmt.Errorf("BAR%d: %w", b.bar, err)
		}
	}
	return img, nil
}

// importPV builds img in v's new shadow manager and BAR spaces (rebuild
// made them, empty) and flushes the apertures' TLBs. Called with v.mu held
// before v's channels are set up again (their page directories come from
// the bindings).
func (v *VGPU) importPV(img *pvImage) error {
	v.shadows.EnablePV(shadow.PVLimits{Objects: pvMaxObjects, Bindings: pvMaxBindings})
	var errs []error
	if img != nil {
		errs = append(errs, v.shadows.PVImport(img.tables))
	}
	for i, b := range v.bars {
		b.sp.SetPV()
		if img == nil || presentEntries(img.bars[i]) == 0 {
			continue
		}
		if _, err := b.sp.PVSet(0, img.bars[i]); err != nil {
			errs = append(errs, fmt.Errorf("BAR%d: %w", b.bar, err))
			continue
		}
		if err := v.agg.phys.flush(b.phys.pd, true); err != nil {
			errs = append(errs, fmt.Errorf("BAR%d TLB flush: %w", b.bar, err))
		}
	}
	return errors.Join(errs...)
}

// scrub zeroes the image's entries (they say where the guest's buffers
// are).
func (p *pvImage) scrub() {
	if p == nil {
		return
	}
	for i := range p.bars {
		clear(p.bars[i])
	}
	if p.tables != nil {
		for _, o := range p.tables.Objects {
			clear(o.Entries)
		}
		clear(p.tables.Bindings)
	}
}

// rewireEnded registers on dst's dispatcher the hooks v's submissions
// wake when they end — its virtual interrupt, a pvdrm back end's CPU_PREP
// waiters — which the old board's dispatcher forgot with it. Called with
// v.mu held and v on dst's dispatcher.
func (v *VGPU) rewireEnded(dst *Aggregator) {
	if l := v.irq.line.Load(); l != nil {
		dst.disp.onEnded(v, l.raise)
	}
	if v.pvdrmWake != nil {
		dst.disp.onEnded(v, v.pvdrmWake)
	}
}
