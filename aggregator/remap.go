package aggregator

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/shadow"
)

// RemapValid marks a remap-table entry whose page is passed through.
const RemapValid = 1

// remapTable is BAR remap's contract with the device model: shared memory
// holding one little-endian u64 per aperture page of the VM's BAR1 slice,
// then one per page of its BAR3 slice. Zero means the page traps; otherwise
// the entry is the page's offset in the VM's VRAM slice | RemapValid, and the
// device model reads and writes it directly in its mapping of the slice. The
// aggregator creates and seals the memory; the device model maps it read-only.
//
// Revoking one entry is not synchronous (for a device model that maps
// remapped pages into its guest it is acknowledged: remap_revoke.go): an access the device model began
// under an entry just cleared may still land in the page. That is harmless
// for isolation — the page is inside the VM's own slice and every shadow
// entry is validated when built — and for consistency the page tracker
// marks the revoked page as possibly written (Tracker.Unseen), so the
// structures in it are rescanned before they are next used. Taking the
// whole slice away (a move) is synchronous: revokeRemap waits for the
// device model's acknowledgement (remap_rebind.go).
type remapTable struct {
	file    *os.File
	mem     []byte
	bar1    int // pages of BAR1 entries (first)
	entries int

	// What the device model maps, and the exchanges that change it
	// (remap_rebind.go). op serialises revokeRemap and rebindRemap; the
	// fields below are under the vGPU's mu.
	op   sync.Mutex
	link remapLink // the device model's connection; nil: none
	// mapped: the device model may hold a mapping of a slice (the
	// Welcome's, or one a rebind handed it) — until it acknowledges a
	// revoke.
	mapped bool
	// held counts revokeRemap calls not yet matched by rebindRemap:
	// while it is non-zero every entry stays 0.
	held int
	// broken says why remap is off for the rest of the connection (the
	// device model did not acknowledge, or could not map): every entry
	// stays 0. "" while it is not.
	broken string
	// rv is per-page revocation for a device model that maps remapped
	// pages into its guest (remap_revoke.go), under the vGPU's mu.
	rv revokeState
}

func newRemapTable(slot Slot) (*remapTable, error) {
	n1, n3 := int(slot.BAR1.Size/nvc0.PageSize), int(slot.BAR3.Size/nvc0.PageSize)
	size := (n1 + n3) * 8
	size = (size + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	fd, err := unix.MemfdCreate("gpuvm-remap", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("remap table: %w", err)
	}
	f := os.NewFile(uintptr(fd), "gpuvm-remap")
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("remap table: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("remap table: seal: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("remap table: %w", err)
	}
	return &remapTable{file: f, mem: mem, bar1: n1, entries: n1 + n3}, nil
}

func (r *remapTable) slot(i int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[i*8])) }

func (r *remapTable) get(i int) uint64    { return atomic.LoadUint64(r.slot(i)) }
func (r *remapTable) set(i int, e uint64) { atomic.StoreUint64(r.slot(i), e) }

func (r *remapTable) close() error {
	err := unix.Munmap(r.mem)
	if cerr := r.file.Close(); err == nil {
		err = cerr
	}
	return err
}

// remapFileDup is a descriptor of its own on the remap table's file, for
// the Welcome; nil when the vGPU has no table (or no longer has one). It is
// taken under v.mu, which a teardown takes to let go of the table before
// it closes it, so a vGPU destroyed during its handshake (a save, a
// control API destroy) never has a closed — or reused — descriptor sent.
func (v *VGPU) remapFileDup() (*os.File, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.remap == nil {
		return nil, nil
	}
	fd, err := unix.FcntlInt(v.remap.file.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("remap table: %w", err)
	}
	return os.NewFile(uintptr(fd), "gpuvm-remap"), nil
}

// updateRemap recomputes which aperture pages may be passed through: those
// that map guest VRAM the page tracker does not need trapped (no RAMIN,
// page directory or page table of a channel or BAR space; no user area
// unless doorbells are polled), and, in BAR1 with trapped doorbells, that
// are not in the guest's poll area. It does nothing if neither the tracked
// pages nor the BAR mappings changed since the last time. A page whose
// pass-through is revoked may have been written without a trap: the
// tracker tells its watchers so.
func (v *VGPU) updateRemap() {
	r := v.remap
	if r == nil || v.remapOff {
		return
	}
	v.settleRevokes()
	if v.remapOff {
		return
	}
	tr := v.shadows.Tracker()
	gen := tr.Generation() + 1
	if !v.remapStale && v.remapAt == gen {
		return
	}
	v.remapAt, v.remapStale = gen, false
	mapped := remapMappedLink(r)
	var revoked []uint64
	var idx []int
	for bi, b := range v.bars {
		base := 0
		if bi == 1 {
			base = r.bar1
		}
		for i := range b.sp.Pages() {
			g := b.sp.GuestPage(i)
			var e uint64
			if g != shadow.NoGuestPage && !tr.Trapped(g) && !(bi == 0 && !v.feat.PollDoorbells && v.inPollArea(uint64(i)*nvc0.PageSize)) {
				e = g&^(nvc0.PageSize-1) | RemapValid
			}
			old := r.get(base + i)
			if r.rv.hold[base+i] || (mapped && old != 0 && old != e) {
				// A mapped device model first unmaps the old page (§6.8).
				e = 0
			}
			if old != e {
				if old != 0 {
					revoked = append(revoked, old>>nvc0.PageShift)
					idx = append(idx, base+i)
				}
				r.set(base+i, e)
			}
		}
	}
	for _, page := range revoked {
		tr.Unseen(page)
	}
	if mapped && len(idx) > 0 {
		v.revokeMapped(r, idx, revoked)
	}
}

func (v *VGPU) inPollArea(off uint64) bool {
	return v.pollOn && off+nvc0.PageSize > v.pollBase && off < v.pollBase+uint64(len(v.chans))*nvc0.UserAreaSize
}

// remappedPages counts the entries currently passed through.
func (v *VGPU) remappedPages() int {
	if v.remap == nil {
		return 0
	}
	n := 0
	for i := range v.remap.entries {
		if v.remap.get(i) != 0 {
			n++
		}
	}
	return n
}
