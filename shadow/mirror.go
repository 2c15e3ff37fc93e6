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
	for j := range next {
		v := binary.LittleEndian.Uint64(raw[j*nvc0.PTESize:])
		lo := uint32(v)
		if lo&nvc0.PTEPresent == 0 {
			next[j] = 0
			continue
		}
		if lo&nvc0.PTEPrivileged != 0 {
			priv++
		}
		if v == last[j] && !writeAll {
			next[j] = cur[j]
			if cur[j] == 0 {
				dropped++
			}
			continue
		}
		sp, ok := translate(nvc0.DecodePTE(lo, uint32(v>>32)))
		if !ok {
			dropped++
			next[j] = 0
			continue
		}
		slo, shi := sp.Encode()
		next[j] = uint64(slo) | uint64(shi)<<32
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
	for j := range last {
		last[j] = binary.LittleEndian.Uint64(raw[j*nvc0.PTESize:])
	}
	return nil
}

// commit writes the entries of next that differ from cur (all of them with
// writeAll) to the shadow structure whose entry 0 is at base, entries being
// stride (8) bytes, coalescing adjacent changed entries into one write, and
// updates cur.
func (s *mirror) commit(base, stride uint64, cur, next []uint64, writeAll bool, st *Stats) error {
	if writeAll {
		return s.writeRun(base, cur, next, st)
	}
	for j := 0; j < len(next); {
		if cur[j] == next[j] {
			j++
			continue
		}
		k := j + 1
		for k < len(next) && cur[k] != next[k] {
			k++
		}
		if err := s.writeRun(base+uint64(j)*stride, cur[j:k], next[j:k], st); err != nil {
			return err
		}
		j = k
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
