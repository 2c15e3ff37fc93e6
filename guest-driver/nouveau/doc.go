// Package nouveau is gpuvm's guest kernel driver for Fermi GPUs, modelled on
// the Linux nouveau driver's behaviour toward the hardware. It touches the GPU
// only through 32-bit BAR reads and writes (gpu.MMIO) and DMA-able host memory,
// so the same code runs natively on the simulated board, inside a VM over a
// virtual GPU, or on a real BAR mapped from sysfs.
//
// What it does, in nouveau's order: identify the chip and size VRAM from the
// memory-partition registers; build the BAR3 page table through the PRAMIN
// window and the BAR1 page table through BAR3; map the channels' user areas
// into BAR1 as the poll area; then, per context, build an address space (page
// directory and page tables written through BAR3 or PRAMIN, each change
// followed by a TLB flush exactly as nouveau does it), create channels (RAMIN,
// GPFIFO and push buffer in DMA memory, channel table, playlist, FECS context
// bind, copy-engine bind), submit push buffers by writing GP_PUT through the
// poll area, and wait for fences by polling semaphore memory. Every failure is
// an error value: timeouts, channel faults with the fault report, allocation
// failures; nothing hangs or panics.
package nouveau
