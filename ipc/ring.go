package ipc

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ring memfd layout (docs/protocol.md, "Ring memory"). Every index and wait
// word sits on its own 64-byte cache line.
const (
	ringMagic   = 0x474E524D56555047 // "GPUVMRNG" little endian
	ringVersion = 1

	ringHdrMagic      = 0x00 // u64
	ringHdrVersion    = 0x08 // u32
	ringHdrEntrySize  = 0x0C // u32
	ringHdrReqEntries = 0x10 // u32
	ringHdrRspEntries = 0x14 // u32
	ringHdrReqOffset  = 0x18 // u32
	ringHdrRspOffset  = 0x1C // u32
	ringHdrTotalSize  = 0x20 // u32
	ringHdrFeatures   = 0x24 // u32: RingFeature* bits the server offers (irq.go)

	ringOffReqProd    = 0x040 // written by the client
	ringOffReqCons    = 0x080 // written by the server
	ringOffRspProd    = 0x0C0 // written by the server
	ringOffRspCons    = 0x100 // written by the client
	ringOffServerWait = 0x140 // server's futex word
	ringOffClientWait = 0x180 // client's futex word
	ringOffIRQCount   = 0x1C0 // virtual interrupts raised (irq.go): server increments
	ringOffIRQWaiters = 0x200 // client threads sleeping on the IRQ count: client
	// 0x240: client_features (remap.go); 0x280: req_done (replay.go)
	ringEntriesOffset = 0x1000

	// MinRingEntries and MaxRingEntries bound each ring's entry count (a
	// power of two).
	MinRingEntries = 2
	MaxRingEntries = 4096

	// Bits of the wait words: what the sleeper waits for.
	waitReq      = 1 // server: request ring non-empty
	waitRspSpace = 2 // server: response ring not full
	waitRsp      = 1 // client: response ring non-empty
	waitReqSpace = 2 // client: request ring not full
)

// DefaultSpin is the default number of polling iterations before a waiter
// sleeps on its futex (ListenOptions.Spin, DialOptions.Spin).
const DefaultSpin = 20000

// ringLayout is the geometry of a ring memfd.
type ringLayout struct {
	reqN, rspN     uint32
	reqOff, rspOff uint64
	size           uint64
}

func isPow2(n uint32) bool { return n != 0 && n&(n-1) == 0 }

func newRingLayout(reqN, rspN uint32) (ringLayout, error) {
	for _, n := range []uint32{reqN, rspN} {
		if !isPow2(n) || n < MinRingEntries || n > MaxRingEntries {
			return ringLayout{}, fmt.Errorf("ring entries %d: need a power of two in %d..%d", n, MinRingEntries, MaxRingEntries)
		}
	}
	l := ringLayout{reqN: reqN, rspN: rspN, reqOff: ringEntriesOffset}
	l.rspOff = l.reqOff + uint64(reqN)*EntrySize
	l.size = (l.rspOff + uint64(rspN)*EntrySize + 4095) &^ 4095
	return l, nil
}

// ringMap is one side's mapping of the ring memfd.
type ringMap struct {
	mem []byte
	l   ringLayout

	reqProd, reqCons, rspProd, rspCons *uint32
	serverWait, clientWait             *uint32
	// reqDone is the server's req_done word (replay.go): the server's
	// mapping always has it; the client reads it only with the feature.
	reqDone *uint32

	// features are the RingFeature bits of the header; irqCount and
	// irqWaiters are the virtual interrupt's words (irq.go), nil when the
	// ring does not offer it.
	features             uint32
	irqCount, irqWaiters *uint32
}

func (r *ringMap) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

func newRingMap(mem []byte, l ringLayout) *ringMap {
	r := &ringMap{mem: mem, l: l}
	r.reqProd = r.word(ringOffReqProd)
	r.reqCons = r.word(ringOffReqCons)
	r.rspProd = r.word(ringOffRspProd)
	r.rspCons = r.word(ringOffRspCons)
	r.serverWait = r.word(ringOffServerWait)
	r.clientWait = r.word(ringOffClientWait)
	r.reqDone = r.word(ringOffReqDone)
	// Read once, at setup: the server wrote it before sending the ring
	// and it never changes (a client that rewrites it later fools only
	// itself; the server keeps its own copy).
	r.features = le.Uint32(mem[ringHdrFeatures:])
	if r.features&RingFeatureIRQ != 0 {
		r.irqCount = r.word(ringOffIRQCount)
		r.irqWaiters = r.word(ringOffIRQWaiters)
	}
	return r
}

// reqSlot returns request entry i (free-running index) in shared memory.
func (r *ringMap) reqSlot(i uint32) []byte {
	o := r.l.reqOff + uint64(i&(r.l.reqN-1))*EntrySize
	return r.mem[o : o+EntrySize : o+EntrySize]
}

// rspSlot returns response entry i (free-running index) in shared memory.
func (r *ringMap) rspSlot(i uint32) []byte {
	o := r.l.rspOff + uint64(i&(r.l.rspN-1))*EntrySize
	return r.mem[o : o+EntrySize : o+EntrySize]
}

func (r *ringMap) unmap() error {
	if r == nil || r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	return err
}

// createRing creates the sealed ring memfd, maps it and writes its header.
// The caller passes the returned file to the client and closes it.
func createRing(l ringLayout) (*ringMap, int, error) {
	f, err := createSealedMemfd("gpuvm-ring", l.size, 0)
	if err != nil {
		return nil, -1, err
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return nil, -1, fmt.Errorf("ipc: dup ring memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(l.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("ipc: mmap ring memfd (%d bytes): %w", l.size, err)
	}
	le.PutUint64(mem[ringHdrMagic:], ringMagic)
	le.PutUint32(mem[ringHdrVersion:], ringVersion)
	le.PutUint32(mem[ringHdrEntrySize:], EntrySize)
	le.PutUint32(mem[ringHdrReqEntries:], l.reqN)
	le.PutUint32(mem[ringHdrRspEntries:], l.rspN)
	le.PutUint32(mem[ringHdrReqOffset:], uint32(l.reqOff))
	le.PutUint32(mem[ringHdrRspOffset:], uint32(l.rspOff))
	le.PutUint32(mem[ringHdrTotalSize:], uint32(l.size))
	le.PutUint32(mem[ringHdrFeatures:], serverRingFeatures)
	// Seal after sizing: the client can neither shrink (SIGBUS in the
	// aggregator) nor grow the file, nor change the seals.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, -1, fmt.Errorf("ipc: seal ring memfd: %w", err)
	}
	return newRingMap(mem, l), fd, nil
}

// mapClientRing validates and maps the ring memfd received in a Welcome.
func mapClientRing(fd int, reqN, rspN uint32) (*ringMap, error) {
	size, err := CheckMemfd(fd, "ring", ringEntriesOffset)
	if err != nil {
		return nil, err
	}
	want, err := newRingLayout(reqN, rspN)
	if err != nil {
		return nil, fmt.Errorf("welcome: %w", err)
	}
	if size != want.size {
		return nil, fmt.Errorf("ring memfd is %d bytes, want %d for %d/%d entries", size, want.size, reqN, rspN)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap ring memfd: %w", err)
	}
	bad := func(what string, got, exp uint64) (*ringMap, error) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("ring header %s is %#x, want %#x", what, got, exp)
	}
	switch {
	case le.Uint64(mem[ringHdrMagic:]) != ringMagic:
		return bad("magic", le.Uint64(mem[ringHdrMagic:]), ringMagic)
	case le.Uint32(mem[ringHdrVersion:]) != ringVersion:
		return bad("version", uint64(le.Uint32(mem[ringHdrVersion:])), ringVersion)
	case le.Uint32(mem[ringHdrEntrySize:]) != EntrySize:
		return bad("entry size", uint64(le.Uint32(mem[ringHdrEntrySize:])), EntrySize)
	case le.Uint32(mem[ringHdrReqEntries:]) != reqN:
		return bad("request entries", uint64(le.Uint32(mem[ringHdrReqEntries:])), uint64(reqN))
	case le.Uint32(mem[ringHdrRspEntries:]) != rspN:
		return bad("response entries", uint64(le.Uint32(mem[ringHdrRspEntries:])), uint64(rspN))
	case uint64(le.Uint32(mem[ringHdrReqOffset:])) != want.reqOff:
		return bad("request offset", uint64(le.Uint32(mem[ringHdrReqOffset:])), want.reqOff)
	case uint64(le.Uint32(mem[ringHdrRspOffset:])) != want.rspOff:
		return bad("response offset", uint64(le.Uint32(mem[ringHdrRspOffset:])), want.rspOff)
	case uint64(le.Uint32(mem[ringHdrTotalSize:])) != want.size:
		return bad("total size", uint64(le.Uint32(mem[ringHdrTotalSize:])), want.size)
	}
	return newRingMap(mem, want), nil
}

// waitFor is the waiter half of the wait/wake protocol. It polls cond up to
// spin times, then announces sleep by storing bit in *word (seq-cst), re-checks
// cond, and sleeps on the futex while *word still equals bit. It returns when
// cond is true; cond must include the caller's "stopped" check, and whoever
// sets that flag must store 0 into *word and wake it.
func waitFor(word *uint32, bit uint32, spin int, cond func() bool) {
	if !spinFor(spin, cond) {
		sleepFor(word, bit, cond)
	}
}

// spinFor polls cond up to spin times (letting the process's other
// goroutines run every 256) and reports whether it became true.
func spinFor(spin int, cond func() bool) bool {
	for i := 0; i < spin; i++ {
		if cond() {
			return true
		}
		if i&255 == 255 {
			runtime.Gosched()
		}
	}
	return false
}

// spinUntil polls cond until the clock passes deadline and reports whether
// it became true. Every 256 polls it yields the process's other goroutines
// and the CPU itself (sched_yield): a long poll must not hold a CPU that a
// runnable thread needs — the peer it waits for, or other VMs' device
// models — it only fills time that CPU would otherwise idle or give back
// to it at once.
func spinUntil(deadline time.Time, cond func() bool) bool {
	for i := 1; ; i++ {
		if cond() {
			return true
		}
		if i&255 == 0 {
			runtime.Gosched()
			unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			if !time.Now().Before(deadline) {
				return cond()
			}
		}
	}
}

// sleepFor is waitFor's sleeping half.
func sleepFor(word *uint32, bit uint32, cond func() bool) {
	for {
		atomic.StoreUint32(word, bit)
		if cond() {
			atomic.StoreUint32(word, 0)
			return
		}
		futexWaitWord(word, bit)
	}
}

// wakeOn is the waker half: called after publishing (a seq-cst store), it
// wakes the peer if it announced it sleeps waiting for bit. The word is
// cleared before FUTEX_WAKE so that a waiter that has checked its condition
// but not yet entered FUTEX_WAIT fails that wait (EAGAIN) instead of
// sleeping through a wake that already happened.
func wakeOn(word *uint32, bit uint32) {
	if w := atomic.LoadUint32(word); w&bit != 0 && atomic.CompareAndSwapUint32(word, w, 0) {
		futexWakeWord(word)
	}
}

// interrupt wakes a local waiter on word after its stop flag was set.
func interrupt(word *uint32) {
	atomic.StoreUint32(word, 0)
	futexWakeWord(word)
}
