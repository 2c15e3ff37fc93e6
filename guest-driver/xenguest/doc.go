// Package xenguest is the guest driver's view of the virtual GPU from inside
// a Xen HVM or PVH guest: the same guest driver (guest-driver/nouveau) that
// runs in a device-model process elsewhere in gpuvm, run instead as a root
// program in the guest itself, so that every register access it makes is a
// real load or store that traps to Xen and reaches the vGPU's device model
// as an ioreq.
//
// It provides the three things nouveau.Open needs:
//
//   - BARs (a gpu.MMIO): the memory BARs (BAR0 registers, BAR1 and BAR3
//     apertures) mmapped shared, either from the PCI function's sysfs
//     resourceN files (an HVM guest, where the guest's firmware enumerated
//     the vGPU) or from /dev/mem at given physical addresses (a PVH guest,
//     which has no PCI enumeration); and BAR5, the 128-byte I/O-port BAR
//     that carries the para-virtual modes' hypercalls, reached with
//     ioperm(2) and the IN/OUT instructions (linux/amd64 only). Every
//     access is one 32-bit load or store instruction, which Xen's
//     instruction emulator turns into one 4-byte ioreq; a run of words the
//     driver clears (gpu.Filler) is one REP STOSL, one ioreq per up to
//     4096 words. The BARs count the accesses and the time spent in them:
//     from inside the guest, that is the round trip of a trap.
//
//   - Discovery: the vGPU's PCI function found in sysfs by its vendor and
//     device id (or named by SBDF), and where its BARs are, from the
//     function's resource file.
//
//   - DMA (a nouveau.HostMemory): a physically contiguous range of guest
//     RAM the guest kernel was told to leave alone with memmap=SIZE$BASE on
//     its command line (reserved in the e820 map, so /dev/mem may map it
//     even with CONFIG_STRICT_DEVMEM), mapped from /dev/mem. A buffer's bus
//     address is its guest-physical address, which is what the vGPU's
//     device model translates.
//
// Every device path (/dev/mem, the sysfs tree, /proc/iomem) is a parameter,
// so the package's tests run on ordinary files.
//
// Nothing here needs a kernel driver in the guest: no nouveau may be bound
// to the vGPU (it would own the BARs), and the program must run as root
// (the sysfs resource files are root's; /dev/mem and ioperm need
// CAP_SYS_RAWIO), on a kernel not locked down (lockdown refuses all three).
package xenguest
