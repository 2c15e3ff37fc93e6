// Package foreign maps a Xen domain's RAM into this process by foreign
// mapping (privcmd IOCTL_PRIVCMD_MMAPBATCH_V2): the dom0 analogue of the
// sealed memfd a VM process hands the aggregator today (gpu/hostmem). A
// RAM is one []byte indexed by guest-physical address, as the aggregator
// wants guest RAM, whose pages are the domain's own frames — or, where the
// guest has no RAM (the VGA hole, the MMIO hole below 4 GiB), zero pages of
// the mapping's own, so no address inside it reaches anyone else's memory
// and none faults. Contains tells RAM from holes for DMA checks.
//
// A RAM is built from a frame list: page i of the guest-physical space is
// frame frames[i] of the domain, or Hole. For HVM and PVH guests the frame
// is the guest frame number itself (Identity builds the list from the
// guest's RAM extents); a PV guest's list is its physical-to-machine map.
// Every frame must map: a frame the domain does not own, or one paged
// out, fails the whole Map with a *privcmd.BatchError naming it.
package foreign
