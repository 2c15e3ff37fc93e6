// Package sim is a simulated NVIDIA Fermi (NVC0, Quadro 6000) GPU board: the
// default "physical GPU" of gpuvm. It implements gpu.MMIO with the real
// register layout and memory formats of gpu/nvc0, so that the guest driver and
// the aggregator run against it the same code they would run against the
// hardware.
//
// # Model
//
//   - VRAM is a sparse memfd mapped shared: untouched pages cost nothing, and
//     the memfd can be mmap'd into other processes (BAR remap). System memory is
//     a set of registered host regions (a VM's RAM memfd mapping, host pinned
//     memory), each given a 1 GiB aligned machine address.
//   - BAR0 is a table of register handlers (regs.go): PMC, the PRAMIN window,
//     the BAR1/BAR3 channel instances, PFIFO (channel table, playlist, poll
//     area, preempt, engine status, fault report, interrupts), the flush and TLB-flush
//     registers, PTIMER, the memory partition registers, the copy-engine
//     instances, PGRAPH status and the FECS command interface. Other offsets
//     read 0, drop writes and are counted.
//   - BAR1 and BAR3 are apertures translated through the page directory named
//     by their instance block; BAR1 also holds the poll area (user areas),
//     where a GP_PUT write rings the channel's doorbell. BAR5 is a stub.
//   - The MMU (mmu.go) walks the two-level page tables (small pages first,
//     then large) with a TLB per address space that, as on the hardware, is
//     only made coherent by a TLB flush naming the page directory.
//   - PFIFO (pfifo.go, pushbuf.go): one worker goroutine per channel fetches
//     GPFIFO entries and push buffers through the channel's MMU, decodes the
//     four method header types and executes methods in order; GP_GET advances
//     once an entry's work is complete. Channel semaphores (release, long
//     release, acquire-equal, acquire-geq) are implemented.
//   - Engines (engines.go) run asynchronously and non-preemptively: one
//     compute engine (one kernel at a time, FIFO) and two copy engines.
//   - A fault stops only the faulting channel and is reported in the fault
//     registers and PFIFO_INTR; there is no restart except disable +
//     re-enable.
//   - A preempt (RegPreempt) takes a channel off the engines: its run ends
//     at the next method boundary and the engine operation in progress is
//     abandoned (kernels check between blocks of work, copies between
//     pages), which folds nouveau's recovery of a channel that will not
//     preempt (context-switch timeout, engine reset) into the preempt.
//     nouveau's stop sequence — clear the enable bit, update the playlist,
//     preempt, wait for the pending bit — therefore always ends in bounded
//     time, and once it has, the channel touches no memory.
//   - System memory is pinned page by page while engines move it:
//     UnregisterSystemMemory waits for the page in flight, so a VM's RAM
//     can be unmapped safely even if a channel still names it. A TLB flush
//     waits for the page walks in flight, so no stale translation is cached
//     after it.
//   - A timing model (timing.go) can make MMIO, kernels and copies cost what
//     they cost on a Fermi board in a PCIe 2.0 slot.
//
// # Simplifications
//
//   - The compute class is a documented subset: a launch names a kernel of
//     the built-in library (gpu/kernels) through a 16-byte code object; the
//     kernel runs for real on the data in GPU memory. There is no shader ISA
//     and no graphics.
//   - The copy class implements pitch-linear copies only (no block-linear
//     layouts, no remapping); LAUNCH_DMA flags are not interpreted.
//   - Posted writes, flushes, playlist updates and TLB flushes complete
//     synchronously: their busy/pending bits never read set afterwards.
//   - There is no interrupt delivery: PFIFO_INTR is only a status register the
//     driver polls. Channel context switching is not modelled: each channel
//     has its own worker, and only the engines are shared.
//   - The PTE privileged bit and memory kinds are informational; the two copy
//     engines share one queue and the copy-engine instance registers are
//     plain storage.
//   - RAMIN must be in VRAM; page tables may be in VRAM or system memory. The
//     page directory must be in VRAM.
//   - Address spaces (one per page directory ever used) are never freed; only
//     their TLBs are bounded.
package sim
