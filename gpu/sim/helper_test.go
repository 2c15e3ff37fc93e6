package sim

import (
	"encoding/binary"
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
	r.b.Write32(nvc0.BAR0, nvc0.RegBAR1Inst, nvc0.InstEncode(r.bar1.ramin, nvc0.BARInstValid))
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
		typ |= nvc0.TLBFlushTypeBARVM
	}
	r.b.Write32(nvc0.BAR0, nvc0.RegTLBFlushPD, uint32(pd>>nvc0.TLBFlushPDShift))
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
	r.w32(c.ramin+nvc0.RAMINUserLo, uint32(c.user))
	r.w32(c.ramin+nvc0.RAMINUserHi, uint32(c.user>>32))
	c.ringPA = c.s.mapVRAM(c.ringVA(), (1<<chanLog2)*nvc0.GPFIFOEntrySize)
	r.w32(c.ramin+nvc0.RAMINGPFIFOLo, uint32(c.ringVA()))
	r.w32(c.ramin+nvc0.RAMINGPFIFOHi, nvc0.GPFIFOHiEncode(c.ringVA(), chanLog2))
	c.pbPA = c.s.mapVRAM(c.pbVA(), chanPBSize)
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanInst(id)), nvc0.InstEncode(c.ramin, nvc0.ChanInstValid|nvc0.ChanInstVRAM))
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(id)), nvc0.ChanCtlDefault)
	r.addToPlaylist(id)
	return c
}

func (c *tchan) ringVA() uint64 { return chanRingVA + uint64(c.id)*nvc0.PageSize }
func (c *tchan) pbVA() uint64   { return chanPBVA + uint64(c.id)*chanPBSize }

func (c *tchan) pollVA() uint64 { return testPollBase + uint64(c.id)*nvc0.UserAreaSize }

func (r *rig) submitPlaylist() {
	for i, ch := range r.list {
		r.w32(r.pl+uint64(i)*nvc0.PlaylistEntrySize, uint32(ch))
	}
	r.b.Write32(nvc0.BAR0, nvc0.RegPlaylistAddr, uint32(r.pl>>nvc0.PageShift))
	r.b.Write32(nvc0.BAR0, nvc0.RegPlaylistSubmit, nvc0.PlaylistSubmitEncode(len(r.list)))
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

// wait waits until the channel has consumed everything or stopped; it
// reports whether it completed.
func (c *tchan) wait() bool {
	c.r.t.Helper()
	deadline := time.Now().Add(hangGuard)
	for time.Now().Before(deadline) {
		if c.gpGet() == c.put && c.ctl()&nvc0.ChanCtlBusy == 0 {
			return true
		}
		if c.ctl()&nvc0.ChanCtlFaulted != 0 {
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
		c.r.t.Fatalf("channel %d faulted: status %#x addr %#x", c.id,
			c.r.b.Read32(nvc0.BAR0, nvc0.RegFaultStatus), c.r.b.Read32(nvc0.BAR0, nvc0.RegFaultAddrLo))
	}
}

func (c *tchan) mustFault() {
	c.r.t.Helper()
	if c.wait() {
		c.r.t.Fatalf("channel %d did not fault", c.id)
	}
}

// Push-buffer snippets.

func semRelease(va uint64, payload uint32) []uint32 {
	return []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), payload, nvc0.SemaphoreRelease}
}

func semAcquire(va uint64, payload uint32, op uint32) []uint32 {
	return []uint32{nvc0.Incr(0, nvc0.MthdSemaphoreAddrHi, 4), uint32(va >> 32), uint32(va), payload, op}
}

func bind(subc, class uint32) []uint32 {
	return []uint32{nvc0.Incr(subc, nvc0.MthdSetObject, 1), class}
}

func copyCmd(subc uint32, src, dst uint64, pitchIn, pitchOut, lineLen, lines uint32) []uint32 {
	return []uint32{
		nvc0.Incr(subc, nvc0.CopyMthdOffsetInHi, 8),
		uint32(src >> 32), uint32(src), uint32(dst >> 32), uint32(dst), pitchIn, pitchOut, lineLen, lines,
		nvc0.Incr(subc, nvc0.CopyMthdLaunchDMA, 1), nvc0.CopyLaunchPitch,
	}
}

func cat(parts ...[]uint32) []uint32 {
	var w []uint32
	for _, p := range parts {
		w = append(w, p...)
	}
	return w
}
