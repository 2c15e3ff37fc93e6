// Package aggregator is the GPU Access Aggregator: the one dom0 component that
// touches the physical GPU. It gives each connected VM a virtual GPU (a vGPU
// control block) with a static partition of the board — a VRAM slice, a range
// of channels, slices of the BAR1 and BAR3 apertures — and virtualizes every
// access the VM's device model forwards:
//
//   - BAR0 registers through a table of handlers (emulated per VM,
//     translated, passed through, or denied — the default);
//   - the PRAMIN window and the BAR1/BAR3 apertures, whose page tables are
//     shadowed into the VM's slice of the physical BAR page tables;
//   - channels, through shadow channels: the physical channel table and
//     playlist only ever hold shadow instance blocks in memory the VM cannot
//     map, whose page directories are shadow page tables built (package
//     shadow) from the guest's tables with every target checked;
//   - doorbells, which are queued per VM and released to the physical
//     doorbell (the scheduler's hook).
//
// The optimizations of GPUvm are switchable per VM: lazy shadowing (scan at
// channel activation instead of at every TLB flush), BAR remap (the VM's
// non-sensitive aperture pages are mapped straight into its device model),
// and incremental shadowing (rescan only the page-table pages written since
// the last scan).
package aggregator
