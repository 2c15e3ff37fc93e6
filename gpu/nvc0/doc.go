// Package nvc0 is the hardware ABI of the NVIDIA Fermi (NVC0 family, e.g. the
// Quadro 6000 / GF100GL) GPU as gpuvm uses it: PCI identity, BAR layout, BAR0
// register offsets and field encodings, the channel instance block (RAMIN), the
// page directory / page table formats, GPFIFO entries, push-buffer method headers,
// the engine classes and methods, and the code-object and parameter layout of the
// simulated board's built-in compute kernels.
//
// It holds no logic beyond encode/decode helpers. Every other package (the
// simulated board, the guest driver, the aggregator, the shadow page tables)
// imports these names instead of writing numbers; that keeps the hardware facts
// in one reviewed place, as gVisor keeps abi/nvgpu apart from nvproxy.
//
// Names follow nouveau (nvkm) and envytools where those name a thing. Where the
// public documentation is silent and the simulated board had to choose (the
// fault-report registers, the simplified compute class), the doc comment says
// "sim:" and describes the choice.
package nvc0
