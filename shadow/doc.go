// Package shadow builds and maintains the shadow GPU page tables and shadow
// channel instance blocks (RAMIN) through which the aggregator confines each
// VM's GPU to the VM's own memory.
//
// It follows GPUvm (Suzuki, PhD thesis 2018, §4.1.2 "Full-Virtualization"):
// the physical GPU never walks a table the guest wrote. For every guest page
// directory the aggregator keeps a shadow page directory and shadow page
// tables in a reserved region of VRAM that no VM can map ("GPU Shadow Page
// Table"), and for every guest channel a shadow channel descriptor that names
// the shadow page directory ("GPU Shadow Channel"). A shadow PTE is the guest
// PTE translated by a [Translator]: guest VRAM addresses are shifted into the
// VM's VRAM slice, guest-physical system-memory addresses become the VM's
// machine addresses, and anything that would leave the VM's memory is dropped
// (written not present). Because nothing translates into the reserved region,
// the shadow structures cannot be reached through a shadow mapping.
//
// Consistency (thesis §4.1.2 and "Lazy Shadowing" in §4.2): Fermi aborts a
// context on a page fault, so shadows cannot be filled on demand; GPUvm
// re-scans the guest tables on a TLB flush (naive) or when a channel is
// activated (lazy shadowing). [Space.Sync] is that full scan. Beyond GPUvm,
// [Space.SyncIncremental] re-scans only the guest pages that the aggregator
// saw written ([Space.NoteWrite], fed from trapped aperture writes) and falls
// back to a full scan after [Space.MarkAllDirty] (the GPU itself, or a
// remapped aperture, may have written without a trap). Every scan diffs
// against a Go-side copy of each shadow table and writes only entries that
// changed, so a rescan of an unchanged guest writes nothing.
//
// The hardware encodings (PDE/PTE words, RAMIN offsets) come from package
// nvc0; this package writes no hardware numbers of its own.
//
// # Decisions
//
//   - A privileged guest PTE is mapped with the privileged bit cleared: the
//     page is the VM's own memory anyway, so the bit protects nothing across
//     VMs, and dropping the page would break a driver that uses it.
//   - Shadow PTEs are re-encoded from the decoded guest PTE ([nvc0.DecodePTE]
//     then [nvc0.PTE.Encode]); bits the decoder does not know are never copied.
//   - A PTE whose target encoding is not VRAM or system memory is dropped.
//   - Large pages (128 KiB) are checked as whole pages and must be large-page
//     aligned both in the guest and after translation.
//   - Guest page tables in system memory (a PDE with a system target) are not
//     supported: such a PDE half is dropped and counted. The page directory
//     and the page tables must lie entirely inside the VM's slice.
//   - The small-page table of a PDE with size field s covers 1/2^s of the
//     PDE's range, as the board walks it; only that part of the guest table is
//     read and shadowed.
//
// # Concurrency
//
// The aggregator serializes all calls for one VM (one goroutine per VM), so
// [Translator] is immutable and safe to share, while [Space], [Manager] and
// [Channel] are not safe for concurrent use; a VM's objects must only be used
// from that VM's goroutine. Spaces of different VMs may share one Allocator
// if the Allocator is concurrency-safe (internal/rangealloc is).
package shadow
