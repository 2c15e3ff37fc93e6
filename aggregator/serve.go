package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/ipc"
)

// Call handles a device model's generic call (ipc.Op*).
func (v *VGPU) Call(op uint16, args []uint64) (ipc.CallResult, error) {
	var r ipc.CallResult
	switch op {
	case ipc.OpCounters:
		if len(args) != 1 {
			return r, fmt.Errorf("counters call with %d arguments", len(args))
		}
		names, all := CounterNames(), v.Counters().Map()
		g := args[0]
		if g >= uint64(len(names)+ipc.MaxCallResults-1)/ipc.MaxCallResults {
			r.Status = -1
			return r, nil
		}
		for i := range ipc.MaxCallResults {
			if k := int(g)*ipc.MaxCallResults + i; k < len(names) {
				r.Result[i] = all[names[k]]
			}
		}
		return r, nil
	case ipc.OpReset:
		// The guest's function-level reset (docs/protocol.md §5.4).
		if len(args) != 0 {
			return r, fmt.Errorf("reset call with %d arguments", len(args))
		}
		a, _ := v.where() // a move may change it (move.go)
		err := a.Reset(v, "function-level reset by the guest")
		switch {
		case err == nil:
		case errors.Is(err, ErrResetDestroyed):
			r.Status = -5 // the connection ends with a Bye
		case errors.Is(err, ErrDetached):
			// Torn down while the reset waited (a save, a migration or
			// a handoff destroyed it): it did not run, so the request
			// is not answered and the device model repeats it on the
			// restored vGPU (docs/protocol.md §6.9, §13.7).
			return r, err
		default:
			r.Status = -1
		}
		return r, nil
	}
	v.ctr.denied.Add(1)
	r.Status = -1 // unknown op: refused, not fatal
	return r, nil
}

// Serve accepts device models on ln until ctx is done. Each accepted VM gets
// a vGPU for as long as its connection lasts; when the device model goes away
// (or breaks the protocol) its vGPU is torn down. Serve returns when ctx is
// done, after every connection ended.
func (a *Aggregator) Serve(ctx context.Context, ln *ipc.Listener) error {
	return AcceptEach(ctx, ln, a.log, a.ServeConn)
}

// AcceptEach accepts device models on ln until ctx is done and serves each
// in its own goroutine; a device model refused at the handshake is logged
// and the loop goes on. It returns when ctx is done (nil) or ln is closed,
// after every serve call returned.
func AcceptEach(ctx context.Context, ln *ipc.Listener, log *slog.Logger, serve func(context.Context, *ipc.Pending)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		p, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ipc.ErrClosed) {
				return err
			}
			log.Warn("device model refused at handshake", "err", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(ctx, p)
		}()
	}
}

// serveVM attaches one VM, serves it, and detaches it; see ServeConnElse
// for elsewhere (nil: none).
func (a *Aggregator) serveVM(ctx context.Context, p *ipc.Pending, elsewhere func() bool) {
	h := p.Hello()
	log := a.log.With("domid", h.DomID, "name", h.Name, "pid", p.Peer().PID)
	{
		// The operator's per-VM mode is a requirement, not a silent
		// override: a device model asking for another would report and
		// label everything with a mode the VM does not run in.
		if m := a.modeFor(Guest{DomID: h.DomID, Name: h.Name, Mode: h.Mode}); m != "" && m != h.Mode {
			log.Warn("refused: mode conflicts with the configuration", "asked", h.Mode, "configured", m)
			_ = p.Reject(fmt.Sprintf("the device model asks for mode %q but the daemon's configuration gives %s (domid %d) mode %q: start it with --mode %s",
				h.Mode, h.Name, h.DomID, m, m))
			return
		}
	}
	if !IsServedMode(h.Mode) {
		log.Warn("refused", "mode", h.Mode)
		_ = p.Reject(fmt.Sprintf("mode %q is not served (have %v)", h.Mode, Modes()))
		return
	}
	if h.RAMSource == ipc.RAMXen {
		if reason := a.refuseDomainRAM(h); reason != "" {
			log.Warn("refused", "reason", reason)
			_ = p.Reject(reason)
			return
		}
	}
	if config.Mode(h.Mode).IsPVDRM() {
		// A resuming front end takes the image waiting for its domain
		// (pvdrm_restore.go); a fresh one never does.
		a.servePVDRM(ctx, p, log)
		return
	}
	g := Guest{DomID: h.DomID, Name: h.Name, Mode: h.Mode, XenRAM: h.RAMSource == ipc.RAMXen, PID: p.Peer().PID, Resume: h.Resume,
		ResumesHandoff: h.ResumesHandoff}
	var v *VGPU
	var err error
	if h.RAMSource == ipc.RAMXen {
		v, err = a.attachWith(g, func() ([]byte, func() error, error) { return a.opts.DomainRAM(h.DomID, h.RAMSize) })
	} else {
		v, err = a.Attach(g, p.RAM(), h.RAMSize)
	}
	if err != nil && errors.Is(err, ErrNoSlot) && elsewhere != nil {
		log.Info("no slot left on the board placement chose: placing again", "err", err)
		if elsewhere() {
			return
		}
	}
	if err != nil {
		log.Warn("refused", "err", err)
		_ = p.Reject(err.Error())
		return
	}
	w := ipc.Welcome{
		VGPU: uint32(v.ID), VRAMSize: v.Slot.VRAM.Size, Channels: uint32(v.Slot.Chans),
		Params: map[string]string{
			ipc.ParamBAR1Size: strconv.FormatUint(v.Slot.BAR1.Size, 10),
			ipc.ParamBAR3Size: strconv.FormatUint(v.Slot.BAR3.Size, 10),
			ipc.ParamTrapNs:   strconv.FormatInt(a.opts.TrapNs, 10),
		},
	}
	if a.opts.Timing != "" {
		w.Params[ipc.ParamTiming] = a.opts.Timing
	}
	var extra []*os.File
	table, err := v.remapFileDup()
	if err != nil {
		log.Error("remap unavailable", "err", err)
		_ = p.Reject("internal error: " + err.Error())
		_ = a.Detach(v)
		return
	}
	if table != nil {
		defer table.Close()
		// The whole slot's segment: with a VRAM quota the guest's slice is
		// its first VRAMSize bytes, which is what the device model maps;
		// the rest of the slot belongs to no one else.
		slice, err := a.sliceFile(a.layout.Slots[v.Slot.Index])
		if err != nil {
			log.Error("remap unavailable", "err", err)
			_ = p.Reject("internal error: " + err.Error())
			_ = a.Detach(v)
			return
		}
		defer slice.Close()
		w.Params[ipc.ParamRemap] = "1"
		w.Params[ipc.ParamMMIOReadNs] = strconv.FormatInt(a.opts.BusReadNs, 10)
		w.Params[ipc.ParamMMIOWriteNs] = strconv.FormatInt(a.opts.BusWriteNs, 10)
		extra = []*os.File{table, slice}
	}
	conn, err := p.Accept(w, extra)
	if err != nil {
		log.Warn("handshake failed", "err", err)
		_ = a.Detach(v)
		return
	}
	v.onHangup(conn.End)
	v.linkRemap(conn) // remap_rebind.go
	a.wireIRQ(v, conn)
	connEnded := v.serving()
	err = conn.Serve(ctx, v)
	close(connEnded)
	var ended *ipc.EndedError
	switch {
	case errors.As(err, &ended):
		log.Info("device model disconnected", "reason", ended.Reason)
	case errors.Is(err, ipc.ErrPeerClosed), ctx.Err() != nil:
		log.Info("device model gone", "reason", err)
	default:
		log.Warn("connection closed", "reason", err)
	}
	if derr := a.Detach(v); derr != nil { // on the board it is on now, if it moved
		log.Error("teardown", "err", derr)
	}
	_ = conn.Close()
}

// SliceFiler is implemented by host GPUs whose VRAM slices can be handed to
// another process (the simulated board's per-slice memfds). BAR remap needs it.
type SliceFiler interface {
	VRAMSegmentFile(base, size uint64) (*os.File, error)
}

func (a *Aggregator) sliceFile(s Slot) (*os.File, error) {
	sf, ok := a.gpu.(SliceFiler)
	if !ok {
		return nil, errors.New("the host GPU cannot pass VRAM slices to device models")
	}
	return sf.VRAMSegmentFile(s.VRAM.Base, s.VRAM.Size)
}

// refuseDomainRAM says why a device model offering its Xen domain's own
// RAM is refused, or "" if it may attach.
func (a *Aggregator) refuseDomainRAM(h ipc.Hello) string {
	switch {
	case a.opts.DomainRAM == nil:
		return fmt.Sprintf("dom %d (%s) offers the RAM of a Xen domain, but this daemon is not serving Xen guests (start it with gpuvm serve --xen, in dom0)", h.DomID, h.Name)
	case config.Mode(h.Mode).IsPVDRM():
		return fmt.Sprintf("dom %d (%s): mode %s on Xen goes over the xen transport (grants, event channels), not a device model", h.DomID, h.Name, h.Mode)
	}
	return ""
}
