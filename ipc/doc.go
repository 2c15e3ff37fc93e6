// Package ipc is the protocol between a VM's device model (the client) and the
// GPU Access Aggregator (the server): a handshake on a Unix SOCK_SEQPACKET
// socket that hands the guest RAM memfd to the aggregator, then 32-bit MMIO
// reads and writes plus a small generic call (the vGPU's counters, today),
// carried either on shared-memory rings or on the socket itself.
//
// The wire format is specified byte for byte in docs/protocol.md; this
// package is the reference implementation of both sides.
//
// # Client (device model)
//
//	ram, _ := ipc.CreateMemfd("vm1-ram", 256<<20)
//	c, w, files, err := ipc.Dial(ctx, "/run/gpuvm/aggregator.sock", ipc.Hello{
//		DomID: 5, Name: "vm1", Mode: "fv-optimized", RAMSize: 256 << 20,
//		Transport: ipc.TransportShm,
//	}, ram, nil, nil)
//	v, err := c.Read32(0, 0x000000)
//	err = c.Write32(0, 0x002270, addr) // posted
//	r, err := c.Call(op, a0, a1)
//
// # Server (aggregator)
//
//	l, _ := ipc.Listen(path, nil)
//	p, _ := l.Accept(ctx) // a validated Hello, RAM memfd checked and sealed
//	sc, _ := p.Accept(ipc.Welcome{VGPU: 1, VRAMSize: 1 << 30, Channels: 32}, nil)
//	go func() { err := sc.Serve(ctx, handler); teardown(err); sc.Close() }()
//
// # Trust
//
// The server treats the client as hostile: every handshake field is bounded
// and validated, the RAM memfd must be sealed against shrinking (so the
// aggregator's mapping can never SIGBUS), every shared-memory ring index is
// validated and every request entry is copied out of shared memory exactly
// once before it is decoded. Any violation ends that one connection: Serve
// returns a *ViolationError and sends the client a Bye with the reason. Serve
// never panics on client input and allocates nothing per request.
package ipc
