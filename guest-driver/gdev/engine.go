package gdev

import (
	"errors"
	"fmt"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
)

// Driver is what a Context runs on: the nouveau driver over (virtual) GPU
// registers, or the pvdrm front end (no registers: whole DRM operations go
// to a back end in dom0). Nouveau and PVDRM make one.
type Driver interface {
	open() (engine, error)
}

// engine is one context's channel and address space on a Driver. Buffers
// are named by the engine's handle for them (nouveau: their GPU virtual
// address; pvdrm: the GEM handle).
type engine interface {
	// allocDevice allocates device memory mapped into the address space;
	// cpu asks for a CPU mapping too (only when cpuAccess reports one).
	allocDevice(size uint64, cpu bool) (DevPtr, error)
	freeDevice(p DevPtr) error
	// allocHost allocates DMA host memory mapped into the address space
	// and into the CPU.
	allocHost(size uint64) (HostBuf, error)
	freeHost(h HostBuf) error
	// cpuAccess reports whether device memory can be CPU-mapped (BAR1);
	// without it, kernel objects live in host memory and small copies go
	// through the copy engine.
	cpuAccess() bool
	cpuWrite(p DevPtr, off uint64, src []byte)
	cpuRead(p DevPtr, off uint64, dst []byte)
	// submit queues a push buffer that uses the buffers named, with a
	// fence after it, and returns the fence.
	submit(words []uint32, uses ...uint32) (uint32, error)
	// wait waits for fence seq; on names a buffer the fenced work used.
	wait(seq uint32, on uint32) error
	// finish waits for everything submitted.
	finish() error
	// stop ends the channel (nothing runs after it); close frees the rest.
	stop() error
	close() error
	// channel is the nouveau channel, if the engine has one.
	channel() *nouveau.Channel
}

// Nouveau returns the Driver of a nouveau device.
func Nouveau(dev *nouveau.Device) Driver { return nouveauDriver{dev} }

type nouveauDriver struct{ dev *nouveau.Device }

func (d nouveauDriver) open() (engine, error) {
	e := &nouveauEngine{dev: d.dev}
	var err error
	if e.vm, err = d.dev.NewVM(); err != nil {
		return nil, err
	}
	if e.ch, err = d.dev.NewChannel(e.vm); err != nil {
		return nil, errors.Join(err, e.vm.Close())
	}
	return e, nil
}

// nouveauEngine drives the GPU's registers through the nouveau driver.
type nouveauEngine struct {
	dev *nouveau.Device
	vm  *nouveau.VM
	ch  *nouveau.Channel
}

func (e *nouveauEngine) allocDevice(size uint64, cpu bool) (p DevPtr, err error) {
	p.Size = size
	if p.vram, err = e.dev.AllocVRAM(size, nvc0.PageSize); err != nil {
		return DevPtr{}, err
	}
	if p.VA, err = e.vm.AllocVA(size, nvc0.PageSize); err != nil {
		e.dev.FreeVRAM(p.vram)
		return DevPtr{}, err
	}
	p.handle = uint32(p.VA >> nvc0.PageShift)
	if err = e.vm.MapVRAM(p.VA, p.vram, size); err != nil {
		e.vm.FreeVA(p.VA)
		e.dev.FreeVRAM(p.vram)
		return DevPtr{}, err
	}
	if cpu {
		if p.bar1, err = e.dev.MapBAR1(p.vram, size); err != nil {
			return DevPtr{}, errors.Join(err, e.freeDevice(p))
		}
		p.mapped = true
	}
	return p, nil
}

func (e *nouveauEngine) freeDevice(p DevPtr) error {
	var errs []error
	if p.mapped {
		errs = append(errs, e.dev.UnmapBAR1(p.bar1))
	}
	errs = append(errs, e.vm.Unmap(p.VA, p.Size), e.vm.FreeVA(p.VA), e.dev.FreeVRAM(p.vram))
	return errors.Join(errs...)
}

func (e *nouveauEngine) allocHost(size uint64) (HostBuf, error) {
	b, err := e.dev.Host().Alloc(size)
	if err != nil {
		return HostBuf{}, err
	}
	va, err := e.vm.AllocVA(uint64(len(b.Bytes)), nvc0.PageSize)
	if err == nil {
		if err = e.vm.MapHost(va, b.Bus, uint64(len(b.Bytes))); err != nil {
			e.vm.FreeVA(va)
		}
	}
	if err != nil {
		return HostBuf{}, errors.Join(err, e.dev.Host().Free(b))
	}
	return HostBuf{Bytes: b.Bytes[:size], VA: va, buf: b, handle: uint32(va >> nvc0.PageShift)}, nil
}

func (e *nouveauEngine) freeHost(h HostBuf) error {
	n := uint64(len(h.buf.Bytes))
	return errors.Join(e.vm.Unmap(h.VA, n), e.vm.FreeVA(h.VA), e.dev.Host().Free(h.buf))
}

func (e *nouveauEngine) cpuAccess() bool { return true }

func (e *nouveauEngine) cpuWrite(p DevPtr, off uint64, src []byte) {
	writeAperture(e.dev.MMIO(), p.bar1+off, src)
}

func (e *nouveauEngine) cpuRead(p DevPtr, off uint64, dst []byte) {
	readAperture(e.dev.MMIO(), p.bar1+off, dst)
}

func (e *nouveauEngine) submit(words []uint32, _ ...uint32) (uint32, error) {
	return e.ch.SubmitFenced(words)
}

func (e *nouveauEngine) wait(seq uint32, _ uint32) error { return e.ch.WaitFence(seq) }

func (e *nouveauEngine) finish() error { return e.ch.Finish() }

func (e *nouveauEngine) channel() *nouveau.Channel { return e.ch }

func (e *nouveauEngine) stop() error {
	if e.ch == nil {
		return nil
	}
	err := e.ch.Close()
	e.ch = nil
	if err != nil {
		return fmt.Errorf("nouveau: %w", err)
	}
	return nil
}

func (e *nouveauEngine) close() error {
	if e.vm == nil {
		return nil
	}
	err := e.vm.Close()
	e.vm = nil
	if err != nil {
		return fmt.Errorf("nouveau: %w", err)
	}
	return nil
}
