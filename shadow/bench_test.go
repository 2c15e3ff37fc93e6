package shadow

import (
	"testing"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// benchGuest is a realistic guest address space: 64 MiB mapped with small
// pages across two PDEs (16384 present PTEs in two full 256 KiB tables).
func benchGuest(b *testing.B) (*env, *Space, []uint64) {
	b.Helper()
	const reserved = 4 << 20
	l := Layout{
		SliceBase: reserved, SliceSize: 1 << 30,
		RAMBase: 1 << 34, RAMSize: 1 << 30,
		Reserved: []Range{{0, reserved}},
	}
	// Only the guest tables are backed: data pages are never touched.
	e := newEnvLayout(b, l, reserved+2<<20)
	const pd, t0, t1 = 0, 0x100000, 0x140000
	tables := []uint64{t0, t1}
	for i, t := range tables {
		e.setPDE(pd, i, nvc0.PDE{SmallPresent: true, SmallAddr: t})
		for j := range 8192 {
			e.setPTE(t, j, nvc0.PTE{Present: true, Addr: 0x1000000 + uint64(i*8192+j)*nvc0.PageSize, Kind: 0xfe})
		}
	}
	s := newSpace(b, e, pd)
	if _, err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	return e, s, tables
}

// BenchmarkFullScan is GPUvm's scan on TLB flush or channel activation: a
// full rescan of an unchanged guest (so nothing is written).
func BenchmarkFullScan(b *testing.B) {
	_, s, _ := benchGuest(b)
	var scanned int
	for b.Loop() {
		st, err := s.Sync()
		if err != nil || st.EntriesWritten != 0 {
			b.Fatal(st, err)
		}
		scanned += st.PTEsScanned
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(scanned), "ns/PTE")
	b.ReportMetric(float64(scanned)/float64(b.N), "PTEs/op")
}

// BenchmarkFullScanBuild builds the shadow from nothing: allocate, scan,
// write every table, free.
func BenchmarkFullScanBuild(b *testing.B) {
	e, s, _ := benchGuest(b)
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	var scanned, written int
	for b.Loop() {
		s := newSpace(b, e, 0)
		st, err := s.Sync()
		if err != nil {
			b.Fatal(err)
		}
		scanned += st.PTEsScanned
		written += st.BytesWritten
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(scanned), "ns/PTE")
	b.ReportMetric(float64(written)/float64(b.N), "B-written/op")
}

// BenchmarkFullScanOneChange is a full rescan after the guest changed one PTE.
func BenchmarkFullScanOneChange(b *testing.B) {
	e, s, tables := benchGuest(b)
	var scanned, written int
	n := 0
	for b.Loop() {
		n++
		e.setPTE(tables[0], 100, nvc0.PTE{Present: true, Addr: uint64(n%64) * nvc0.PageSize})
		st, err := s.Sync()
		if err != nil {
			b.Fatal(err)
		}
		scanned += st.PTEsScanned
		written += st.BytesWritten
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(scanned), "ns/PTE")
	b.ReportMetric(float64(written)/float64(b.N), "B-written/op")
}

// BenchmarkIncrementalScan: the guest changes one PTE, the write is noted,
// and the incremental scan re-reads that one page-table page (512 PTEs).
func BenchmarkIncrementalScan(b *testing.B) {
	e, s, tables := benchGuest(b)
	var scanned, written int
	n := 0
	for b.Loop() {
		n++
		a := e.setPTE(tables[1], 4000, nvc0.PTE{Present: true, Addr: uint64(n%64) * nvc0.PageSize})
		s.NoteWrite(a, nvc0.PTESize)
		st, err := s.SyncIncremental()
		if err != nil || st.Kind != ScanIncremental {
			b.Fatal(st, err)
		}
		scanned += st.PTEsScanned
		written += st.BytesWritten
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(scanned), "ns/PTE")
	b.ReportMetric(float64(scanned)/float64(b.N), "PTEs/op")
	b.ReportMetric(float64(written)/float64(b.N), "B-written/op")
}

// BenchmarkNoteWrite is the per-trapped-write cost (a data page: a miss).
func BenchmarkNoteWrite(b *testing.B) {
	_, s, _ := benchGuest(b)
	for b.Loop() {
		s.NoteWrite(0x800000, 4)
	}
}
