package sim

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// Test rig: a board plus helpers that build the structures a driver builds —
// page tables through PRAMIN, RAMINs, the BAR1 aperture with the poll area,
// channels with a GPFIFO ring and push buffers — using only MMIO (and host
// VRAM access for bulk data).

const (
	testVRAM     = 256 << 20
	testPollBase = 0x100000 // BAR1 virtual address of the poll area
	testLimit    = nvc0.VASize - 1
	hangGuard    = 20 * time.Second // not a performance threshold: catches deadlocks
)

type rig struct {
	mu   sync.Mutex // the PRAMIN window is shared state: one window user at a time
	t    testing.TB
	b    *Board
	next uint64 // VRAM bump allocator
	bar1 *space
	list []int // channels in the playlist
	pl   uint64
}

func newRig(t testing.TB) *rig {
	return newRigConfig(t, Config{VRAMSize: testVRAM, Channels: 8, MemPartitions: 4})
}

func newRigConfig(t testing.TB, cfg Config) *rig {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r := &rig{t: t, b: b, next: 1 << 20}
	r.pl = r.alloc(nvc0.PageSize, nvc0.PageSize)
	r.bar1 = r.newSpace(nvc0.BAR1Size - 1)
	r.b.Write32(nvc0.BAR0, nvc0.RegBAR1Inst, nvc0.InstEncode(r.bar1.ramin, nvc0.BARInstModeVM))
	r.b.Write32(nvc0.BAR0, nvc0.RegPollArea, testPollBase>>nvc0.PageShift|nvc0.PollAreaEnable)
	return r
}

// alloc returns align-aligned VRAM.
func (r *rig) alloc(size, align uint64) uint64 {
	a := (r.next + align - 1) &^ (align - 1)
	r.next = a + size
	if r.next > r.b.VRAMSize() {
		r.t.Fatalf("test VRAM exhausted")
	}
	return a
}

// w32 writes a VRAM word through the PRAMIN window.
func (r *rig) w32(addr uint64, v uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, uint32(addr>>nvc0.PRAMINWindowShift))
	r.b.Write32(nvc0.BAR0, nvc0.PRAMINBase+addr&(1<<nvc0.PRAMINWindowShift-1), v)
}

// r32 reads a VRAM word through the PRAMIN window.
func (r *rig) r32(addr uint64) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, uint32(addr>>nvc0.PRAMINWindowShift))
	return r.b.Read32(nvc0.BAR0, nvc0.PRAMINBase+addr&(1<<nvc0.PRAMINWindowShift-1))
}

func (r *rig) w64(addr, v uint64) { r.w32(addr, uint32(v)); r.w32(addr+4, uint32(v>>32)) }

func (r *rig) hostWrite(addr uint64, p []byte) {
	if err := r.b.WriteVRAM(p, addr); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) hostRead(addr uint64, n int) []byte {
	p := make([]byte, n)
	if err := r.b.ReadVRAM(p, addr); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// flushTLB flushes a page directory's TLB through the MMU registers.
func (r *rig) flushTLB(pd uint64, bar bool) {
	typ := uint32(nvc0.TLBFlushTypeVM)
	if bar {
		typ = nvc0.TLBFlushTypeBAR
	}
	r.b.Write32(nvc0.BAR0, nvc0.RegTLBFlushPD, nvc0.TLBFlushPDEncode(pd))
	r.b.Write32(nvc0.BAR0, nvc0.RegTLBFlushTrigger, nvc0.TLBFlushTrigger|typ)
}

// space is a GPU address space built in VRAM.
type space struct {
	r       *rig
	pd      uint64
	ramin   uint64 // a RAMIN naming pd and the limit
	limit   uint64
	pdes    map[uint64]nvc0.PDE
	sysPT   bool    // put new page tables in system memory (sys)
	sys     *sysMem // where system-memory page tables go
	sysNext uint64
}

func (r *rig) newSpace(limit uint64) *space {
	s := &space{r: r, limit: limit, pdes: map[uint64]nvc0.PDE{}}
	s.pd = r.alloc(nvc0.PageDirSize, nvc0.PageSize)
	s.ramin = r.alloc(nvc0.RAMINSize, nvc0.PageSize)
	s.writeRAMIN(s.ramin)
	return s
}

// writeRAMIN writes the address-space part of a RAMIN.
func (s *space) writeRAMIN(ramin uint64) {
	s.r.w64(ramin+nvc0.RAMINPageDir, s.pd)
	s.r.w64(ramin+nvc0.RAMINAddrLimit, s.limit)
}

func (s *space) writePDE(idx uint64) {
	w0, w1 := s.pdes[idx].Encode()
	s.r.w32(s.pd+idx*nvc0.PDESize, w0)
	s.r.w32(s.pd+idx*nvc0.PDESize+4, w1)
}

// table returns the page table of the given size for va, creating it.
func (s *space) table(va uint64, large bool) (addr uint64, sys bool) {
	idx := nvc0.PDEIndex(va)
	p := s.pdes[idx]
	if large && !p.LargePresent {
		p.LargePresent, p.LargeAddr, p.LargeSys = true, s.newTable(nvc0.LargePTSize), s.sysPT
	}
	if !large && !p.SmallPresent {
		p.SmallPresent, p.SmallAddr, p.SmallSys = true, s.newTable(nvc0.SmallPTSize), s.sysPT
	}
	s.pdes[idx] = p
	s.writePDE(idx)
	if large {
		return p.LargeAddr, p.LargeSys
	}
	return p.SmallAddr, p.SmallSys
}

func (s *space) newTable(size uint64) uint64 {
	if !s.sysPT {
		return s.r.alloc(size, nvc0.PageSize)
	}
	// Page tables in system memory: carve from the registered region.
	a := s.sys.base + s.sysNext
	s.sysNext += size
	return a
}

// mapPage maps the page at va to pa.
func (s *space) mapPage(va, pa uint64, target uint32, large, ro bool) {
	tab, sys := s.table(va, large)
	idx := nvc0.SmallPTEIndex(va)
	if large {
		idx = nvc0.LargePTEIndex(va)
	}
	lo, hi := nvc0.PTE{Present: true, ReadOnly: ro, Addr: pa, Target: target}.Encode()
	s.writeTableWord(tab, sys, idx*nvc0.PTESize, lo)
	s.writeTableWord(tab, sys, idx*nvc0.PTESize+4, hi)
}

func (s *space) unmapPage(va uint64, large bool) {
	tab, sys := s.table(va, large)
	idx := nvc0.SmallPTEIndex(va)
	if large {
		idx = nvc0.LargePTEIndex(va)
	}
	s.writeTableWord(tab, sys, idx*nvc0.PTESize, 0)
	s.writeTableWord(tab, sys, idx*nvc0.PTESize+4, 0)
}

func (s *space) writeTableWord(tab uint64, sys bool, off uint64, v uint32) {
	if !sys {
		s.r.w32(tab+off, v)
		return
	}
	binary.LittleEndian.PutUint32(s.sys.mem[tab-s.sys.base+off:], v)
}

// mapVRAM maps n bytes at va to fresh VRAM with small pages and returns the VRAM address.
func (s *space) mapVRAM(va, n uint64) uint64 {
	n = (n + nvc0.PageSize - 1) &^ (nvc0.PageSize - 1)
	pa := s.r.alloc(n, nvc0.PageSize)
	for o := uint64(0); o < n; o += nvc0.PageSize {
		s.mapPage(va+o, pa+o, nvc0.TargetVRAM, false, false)
	}
	return pa
}

// mapSys maps n bytes at va to machine address ma with small pages.
func (s *space) mapSys(va, ma, n uint64) {
	for o := uint64(0); o < n; o += nvc0.PageSize {
		s.mapPage(va+o, ma+o, nvc0.TargetSysSnooped, false, false)
	}
}

// sysMem is registered host memory (an anonymous mapping, so the race detector
// treats it like device memory).
type sysMem struct {
	base uint64
	mem  []byte
}

func (r *rig) newSysMem(size int) *sysMem {
	r.t.Helper()
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		r.t.Fatal(err)
	}
	base, err := r.b.RegisterSystemMemory(mem)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		r.b.UnregisterSystemMemory(base)
		unix.Munmap(mem)
	})
	return &sysMem{base: base, mem: mem}
}

// Channel layout in its address space.
const (
	chanRingVA = 0x10000000 // GPFIFO rings, one page per channel id
	chanPBVA   = 0x20000000 // push buffers, chanPBSize per channel id
	chanDataVA = 0x40000000 // free for tests
	chanCtxVA  = 0x30000000 // engine contexts: one page per channel id (GR, CE0, CE1 at 0x100 apart)
	chanLog2   = 6          // 64 GPFIFO entries
	chanPBSize = 64 * nvc0.PageSize
)

// tchan is a channel set up the way a driver would.
type tchan struct {
	r      *rig
	id     int
	s      *space
	ramin  uint64
	user   uint64 // VRAM
	ringPA uint64
	pbPA   uint64
	pbNext uint64
	put    uint32
	ctxPA  uint64 // the engine contexts' page
}

func (r *rig) newChan(id int, s *space) *tchan {
	c := &tchan{r: r, id: id, s: s}
	if s == nil {
		c.s = r.newSpace(testLimit)
	}
	c.ramin = r.alloc(nvc0.RAMINSize, nvc0.PageSize)
	c.s.writeRAMIN(c.ramin)
	c.user = r.alloc(nvc0.UserAreaSize, nvc0.PageSize)
	r.bar1.mapPage(c.pollVA(), c.user, nvc0.TargetVRAM, false, false)
	r.w32(c.ramin+nvc0.RAMINSignature, nvc0.RAMINSignatureValue)
	lo, hi := nvc0.RAMINAddrEncode(c.user)
	r.w32(c.ramin+nvc0.RAMINUserLo, lo)
	r.w32(c.ramin+nvc0.RAMINUserHi, hi)
	c.ctxPA = c.s.mapVRAM(c.ctxVA(0), nvc0.PageSize)
	for i, off := range []uint64{nvc0.RAMINEngineGR, nvc0.RAMINEngineCE0, nvc0.RAMINEngineCE1} {
		lo, hi := nvc0.RAMINEngineEncode(c.ctxVA(i))
		r.w32(c.ramin+off, lo)
		r.w32(c.ramin+off+4, hi)
	}
	c.ringPA = c.s.mapVRAM(c.ringVA(), (1<<chanLog2)*nvc0.GPFIFOEntrySize)
	r.w32(c.ramin+nvc0.RAMINGPFIFOLo, uint32(c.ringVA()))
	r.w32(c.ramin+nvc0.RAMINGPFIFOHi, nvc0.GPFIFOHiEncode(c.ringVA(), chanLog2))
	c.pbPA = c.s.mapVRAM(c.pbVA(), chanPBSize)
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(id)), nvc0.InstEncode(c.ramin, nvc0.ChanInstValid|nvc0.ChanInstPollEnable))
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(id)), nvc0.ChanCtlDefault)
	r.addToPlaylist(id)
	return c
}

// ctxVA is the virtual address of engine context i (0 GR, 1 CE0, 2 CE1).
func (c *tchan) ctxVA(i int) uint64 {
	return chanCtxVA + uint64(c.id)*nvc0.PageSize + uint64(i)*nvc0.EngineContextSize
}

func (c *tchan) ringVA() uint64 { return chanRingVA + uint64(c.id)*nvc0.PageSize }
func (c *tchan) pbVA() uint64   { return chanPBVA + uint64(c.id)*chanPBSize }

func (c *tchan) pollVA() uint64 { return testPollBase + uint64(c.id)*nvc0.UserAreaSize }

func (r *rig) submitPlaylist() {
	for i, ch := range r.list {
		r.w32(r.pl+uint64(i)*nvc0.PlaylistEntrySize, uint32(ch))
	}
	r.b.Write32(nvc0.BAR0, nvc0.RegPlaylistAddr, nvc0.PlaylistAddrEncode(r.pl))
	r.b.Write32(nvc0.BAR0, nvc0.RegPlaylistSubmit, nvc0.PlaylistSubmitEncode(len(r.list)))
	// The update is done: acknowledge the runlist interrupt, as
	// gf100_fifo_intr_runlist does.
	if r.b.Read32(nvc0.BAR0, nvc0.RegRunlistIntr) != nvc0.RunlistIntrDone {
		r.t.Fatalf("no runlist-done interrupt after a playlist update")
	}
	r.b.Write32(nvc0.BAR0, nvc0.RegRunlistIntr, nvc0.RunlistIntrDone)
}

func (r *rig) addToPlaylist(id int) {
	r.list = append(r.list, id)
	r.submitPlaylist()
}

// push writes a push buffer, queues it in the GPFIFO and rings the doorbell.
func (c *tchan) push(words ...uint32) {
	c.queue(words...)
	c.ring()
}

// queue writes a push buffer and a GPFIFO entry without ringing the doorbell.
func (c *tchan) queue(words ...uint32) {
	if c.pbNext+uint64(len(words))*4 > chanPBSize {
		c.pbNext = 0
	}
	va := c.pbVA() + c.pbNext
	for i, w := range words {
		c.r.w32(c.pbPA+c.pbNext+uint64(i)*4, w)
	}
	c.pbNext += (uint64(len(words))*4 + 15) &^ 15
	c.queueEntry(va, uint32(len(words)))
}

func (c *tchan) queueEntry(va uint64, words uint32) {
	w0, w1 := nvc0.GPFIFOEncode(va, words)
	e := c.ringPA + uint64(c.put)*nvc0.GPFIFOEntrySize
	c.r.w32(e, w0)
	c.r.w32(e+4, w1)
	c.put = (c.put + 1) % (1 << chanLog2)
}

// ring writes GP_PUT through the poll area.
func (c *tchan) ring() {
	c.r.b.Write32(nvc0.BAR1, c.pollVA()+nvc0.UserGPPut, c.put)
}

func (c *tchan) gpGet() uint32 { return c.r.b.Read32(nvc0.BAR1, c.pollVA()+nvc0.UserGPGet) }

func (c *tchan) ctl() uint32 { return c.r.b.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(c.id))) }

// report is one error report the board presents: an MMU fault record or a
// PBDMA error.
type report struct {
	fault bool
	unit  int    // fault unit (fault) or PBDMA (method error)
	inst  uint32 // fault: instance word
	va    uint64 // fault: address
	typ   uint32 // fault: type word
	intr  uint32 // method error: PBDMA INTR
	mthd  uint32 // method error: method cache word
	data  uint32 // method error: data
	chid  uint32 // method error: channel register
}

func (rp report) reason() uint32 { return rp.typ & nvc0.FaultTypeReasonMask }

func (rp report) String() string {
	if rp.fault {
		return fmt.Sprintf("MMU fault unit %#x inst %#x va %#x type %#x (%s)", rp.unit, rp.inst, rp.va, rp.typ, nvc0.FaultReasonName(rp.reason()))
	}
	return fmt.Sprintf("PBDMA %d intr %#x method %#x data %#x chan %#x", rp.unit, rp.intr, rp.mthd, rp.data, rp.chid)
}

// reports returns the reports the board presents (one per unit and PBDMA).
func (r *rig) reports() []report {
	rd := func(off uint32) uint32 { return r.b.Read32(nvc0.BAR0, uint64(off)) }
	var out []report
	mask := rd(nvc0.RegFaultUnitMask)
	for u := range nvc0.NumFaultUnits {
		if mask&(1<<u) != 0 {
			out = append(out, report{fault: true, unit: u, inst: rd(nvc0.RegFaultInst(u)),
				va: uint64(rd(nvc0.RegFaultVAHi(u)))<<32 | uint64(rd(nvc0.RegFaultVALo(u))), typ: rd(nvc0.RegFaultType(u))})
		}
	}
	src := rd(nvc0.RegPBDMAIntrSource)
	for p := range nvc0.NumPBDMAs {
		if src&(1<<p) != 0 {
			out = append(out, report{unit: p, intr: rd(nvc0.RegPBDMAIntr(p)), mthd: rd(nvc0.RegPBDMAMethod(p)),
				data: rd(nvc0.RegPBDMAData(p)), chid: rd(nvc0.RegPBDMAChan(p))})
		}
	}
	return out
}

// ack releases every presented report.
func (r *rig) ack() {
	for _, rp := range r.reports() {
		if rp.fault {
			r.b.Write32(nvc0.BAR0, nvc0.RegFaultUnitMask, 1<<rp.unit)
		} else {
			r.b.Write32(nvc0.BAR0, uint64(nvc0.RegPBDMAIntr(rp.unit)), rp.intr)
		}
	}
}

// report returns the presented report about this channel, if any.
func (c *tchan) report() (report, bool) {
	for _, rp := range c.r.reports() {
		if rp.fault && rp.inst == nvc0.InstEncode(c.ramin, 0) ||
			!rp.fault && rp.chid&nvc0.PBDMAChanMask == uint32(c.id) {
			return rp, true
		}
	}
	return report{}, false
}

// wait waits until the channel has consumed everything or an error report
// about it appears; it reports whether it completed.
func (c *tchan) wait() bool {
	c.r.t.Helper()
	deadline := time.Now().Add(hangGuard)
	for time.Now().Before(deadline) {
		if c.gpGet() == c.put && c.ctl()&nvc0.ChanCtlPending == 0 {
			return true
		}
		if _, ok := c.report(); ok {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
	c.r.t.Fatalf("channel %d hung: GP_GET %d, GP_PUT %d, ctl %#x", c.id, c.gpGet(), c.put, c.ctl())
	return false
}

func (c *tchan) mustFinish() {
	c.r.t.Helper()
	if !c.wait() {
		rp, _ := c.report()
		c.r.t.Fatalf("channel %d stopped: %v", c.id, rp)
	}
}

// mustFault waits for an error report about the channel and returns it.
func (c *tchan) mustFault() report {
	c.r.t.Helper()
	if c.wait() {
		c.r.t.Fatalf("channel %d did not fault", c.id)
	}
	rp, _ := c.report()
	return rp
}

// mustFaultReason waits for an MMU fault of the channel with that reason.
func (c *tchan) mustFaultReason(reason uint32) report {
	c.r.t.Helper()
	rp := c.mustFault()
	if !rp.fault || rp.reason() != reason {
		c.r.t.Fatalf("channel %d: %v, want an MMU fault %s", c.id, rp, nvc0.FaultReasonName(reason))
	}
	return rp
}

// mustMethodError waits for a PBDMA error of the channel with that INTR bit.
func (c *tchan) mustMethodError(intr uint32) report {
	c.r.t.Helper()
	rp := c.mustFault()
	if rp.fault || rp.intr&intr == 0 {
		c.r.t.Fatalf("channel %d: %v, want PBDMA intr %#x", c.id, rp, intr)
	}
	return rp
}

// Push-buffer snippets.

func semRelease(va uint64, payload uint32) []uint32 {
	return []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), payload, nvc0.SemaphoreRelease | nvc0.SemaphoreRelease4Byte}
}

func semAcquire(va uint64, payload uint32, op uint32) []uint32 {
	return []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), payload, op}
}

func bind(subc, class uint32) []uint32 {
	return []uint32{nvc0.Incr(subc, nvc0.MthdSetObject, 1), class}
}

func copyCmd(subc uint32, src, dst uint64, pitchIn, pitchOut, lineLen, lines uint32) []uint32 {
	return []uint32{
		nvc0.Incr(subc, nvc0.CopyMthdSrcAddrHi, 8),
		uint32(src >> 32), uint32(src), uint32(dst >> 32), uint32(dst), pitchIn, pitchOut, lineLen, lines,
		nvc0.Immd(subc, nvc0.CopyMthdExec, nvc0.CopyExecLinear),
	}
}

func cat(parts ...[]uint32) []uint32 {
	var w []uint32
	for _, p := range parts {
		w = append(w, p...)
	}
	return w
}
