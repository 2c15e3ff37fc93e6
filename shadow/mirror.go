package shadow

import (
	"encoding/binary"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// mirror translates guest page tables into shadow page tables: the code
// channel address spaces (Space) and BAR apertures (BARSpace) share. A
// shadow table is any run of PTE slots in VRAM the guest cannot reach — a
// table in the reserve, or the VM's slice of the physical BAR page table.
type mirror struct {
	mem  Memory
	tr   *Translator
	gen  uint64   // scan generation
	rbuf []byte   // guest page-table bytes read
	wbuf []byte   // shadow bytes to write
	next []uint64 // shadow entries being computed
}

// table is one shadow page table and the guest table it mirrors.
type table struct {
	large   bool
	guest   uint64   // guest VRAM address of the guest table
	entries int      // number of PTEs
	shadow  uint64   // physical VRAM address of the shadow table
	cur     []uint64 // shadow PTEs as written to VRAM (lo | hi<<32)
	// guestRaw holds the guest PTEs cur was translated from (lo | hi<<32).
	// cur[i] is a function of guestRaw[i] only, so a rescan translates
	// only entries whose guest word changed.
	guestRaw []uint64
	gen      uint64 // scan generation of the last whole-table scan
}

func (t *table) bytes() uint64 { return uint64(t.entries) * nvc0.PTESize }

// readGuest reads n bytes of guest memory at physical address phys into
// buf (grown if needed) and returns them.
func (s *mirror) readGuest(buf *[]byte, phys, n uint64, st *Stats) ([]byte, error) {
	if uint64(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	if err := s.mem.ReadVRAM(b, phys); err != nil {
		return nil, fmt.Errorf("read guest tables at %#x (+%#x): %w", phys, n, err)
	}
	st.BytesRead += int(n)
	return b, nil
}

// scanTable re-reads guest PTEs [from, to) of t, translates them and writes
// the shadow entries that changed (all of them with writeAll).
func (s *mirror) scanTable(t *table, from, to int, writeAll bool, st *Stats) error {
	if to <= from {
		return nil
	}
	phys, ok := s.tr.VRAMAddr(t.guest+uint64(from)*nvc0.PTESize, uint64(to-from)*nvc0.PTESize)
	if !ok { // cannot happen: the whole table was checked when linked
		return fmt.Errorf("guest table at %#x: %w", t.guest, ErrOutsideSlice)
	}
	raw, err := s.readGuest(&s.rbuf, phys, uint64(to-from)*nvc0.PTESize, st)
	if err != nil {
		return err
	}
	next := s.next[:to-from]
	translate := s.tr.PTE
	if t.large {
		translate = s.tr.LargePTE
	}
	// The shadow entry is a function of the guest entry alone, so a guest
	// entry equal to the one last translated keeps its shadow entry: a
	// rescan of unchanged tables is a comparison, not a translation.
	cur, last := t.cur[from:to], t.guestRaw[from:to]
	dropped, priv := 0, 0
	for j := 0; j < len(next); {
		// Entries that need no translation go by in bulk.
		k, d, p := scanUnchanged(raw, cur, last, next, j, writeAll)
		dropped, priv, j = dropped+d, priv+p, k
		if j == len(next) {
			break
		}
		lo := uint32(binary.LittleEndian.Uint64(raw[j*nvc0.PTESize:]))
		hi := binary.LittleEndian.Uint32(raw[j*nvc0.PTESize+4:])
		if lo&nvc0.PTEPrivileged != 0 {
			priv++
		}
		next[j] = 0
		if sp, ok := translate(nvc0.DecodePTE(lo, hi)); ok {
			slo, shi := sp.Encode()
			next[j] = uint64(slo) | uint64(shi)<<32
		} else {
			dropped++
		}
		j++
	}
	st.PTEsScanned += to - from
	st.PTEsDropped += dropped
	st.PrivCleared += priv
	if from == 0 && to == t.entries {
		t.gen = s.gen
	}
	if err := s.commit(t.shadow+uint64(from)*nvc0.PTESize, nvc0.PTESize, cur, next, writeAll, st); err != nil {
		return fmt.Errorf("write shadow table at %#x: %w", t.shadow, err)
	}
	// Only now does cur hold the translation of these guest entries.
	rememberGuest(last, raw)
	return nil
}

// The three loops below run over every entry of every table a scan
// visits, and only over the mirror's own buffers (raw is its private copy
// of the guest's table; cur, last and next are the mirror's, used under
// the Space's or BARSpace's lock). The race detector's instrumentation
// made them most of the CPU an instrumented fv-naive aggregator spends, so
// they are left out of it (go:norace): every other access to these
// buffers — commit's writes, the translations, readGuest's copy — is
// still checked.

// scanUnchanged goes over entries j.. of a scan while they need no
// translation — not present, or (without writeAll) equal to the guest
// entry cur was translated from — setting next for each, and returns
// where it stopped (len(next) at the end), with the entries it dropped
// (kept without a shadow entry) and the privileged ones among them.
//
//go:norace
func scanUnchanged(raw []byte, cur, last, next []uint64, j int, writeAll bool) (stop, dropped, priv int) {
	for ; j < len(next); j++ {
		v := binary.LittleEndian.Uint64(raw[j*nvc0.PTESize:])
		lo := uint32(v)
		if lo&nvc0.PTEPresent == 0 {
			next[j] = 0
			continue
		}
		if v != last[j] || writeAll {
			return j, dropped, priv
		}
		if lo&nvc0.PTEPrivileged != 0 {
			priv++
		}
		next[j] = cur[j]
		if cur[j] == 0 {
			dropped++
		}
	}
	return j, dropped, priv
}

// rememberGuest records the guest entries raw as those cur was translated
// from.
//
//go:norace
func rememberGuest(last []uint64, raw []byte) {
	for j := range last {
		last[j] = binary.LittleEndian.Uint64(raw[j*nvc0.PTESize:])
	}
}

// changedRun returns the first run [j, k) of entries from j on where cur
// and next differ (j == k == len(next) when none do).
//
//go:norace
func changedRun(cur, next []uint64, j int) (int, int) {
	for j < len(next) && cur[j] == next[j] {
		j++
	}
	k := j
	for k < len(next) && cur[k] != next[k] {
		k++
	}
	return j, k
}

// commit writes the entries of next that differ from cur (all of them with
// writeAll) to the shadow structure whose entry 0 is at base, entries being
// stride (8) bytes, coalescing adjacent changed entries into one write, and
// updates cur.
func (s *mirror) commit(base, stride uint64, cur, next []uint64, writeAll bool, st *Stats) error {
	if writeAll {
		return s.writeRun(base, cur, next, st)
	}
	for j, k := changedRun(cur, next, 0); j < len(next); j, k = changedRun(cur, next, k) {
		if err := s.writeRun(base+uint64(j)*stride, cur[j:k], next[j:k], st); err != nil {
			return err
		}
	}
	return nil
}

// entryBytes is the size of the entries commit and writeRun handle: a PDE or
// a PTE, two little-endian 32-bit words held in a uint64 as lo | hi<<32.
const entryBytes = nvc0.PTESize

// PDEs and PTEs must have the same size (this fails to compile otherwise).
const _ = uint(nvc0.PDESize-nvc0.PTESize) + uint(nvc0.PTESize-nvc0.PDESize)

// writeRun writes the entries next at addr and copies them to cur.
func (s *mirror) writeRun(addr uint64, cur, next []uint64, st *Stats) error {
	n := len(next) * entryBytes
	if cap(s.wbuf) < n {
		s.wbuf = make([]byte, max(n, nvc0.SmallPTSize))
	}
	b := s.wbuf[:n]
	for j, v := range next {
		binary.LittleEndian.PutUint64(b[j*entryBytes:], v)
	}
	if err := s.mem.WriteVRAM(b, addr); err != nil {
		return fmt.Errorf("write %#x bytes at %#x: %w", n, addr, err)
	}
	copy(cur, next)
	st.EntriesWritten += len(next)
	st.BytesWritten += n
	return nil
}
