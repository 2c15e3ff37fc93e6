package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// ErrNoRegisters is the device-model connection's answer to a register
// access from a pvdrm guest, which has none: the connection ends.
var ErrNoRegisters = errors.New("a pvdrm guest has no GPU registers")

// pvdrmConn serves a pvdrm front end's device-model connection: generic
// calls (counters) only.
type pvdrmConn struct{ v *VGPU }

func (c pvdrmConn) Read32(bar int, off uint64) (uint32, error) {
	c.v.ctr.denied.Add(1)
	return 0, fmt.Errorf("read of BAR%d %#x: %w", bar, off, ErrNoRegisters)
}

func (c pvdrmConn) Write32(bar int, off uint64, _ uint32) error {
	c.v.ctr.denied.Add(1)
	return fmt.Errorf("write of BAR%d %#x: %w", bar, off, ErrNoRegisters)
}

func (c pvdrmConn) Call(op uint16, args []uint64) (ipc.CallResult, error) { return c.v.Call(op, args) }

// servePVDRM attaches a pvdrm front end: the handshake carries its GART
// heap as the RAM memfd and the local transport's three files (ring
// memfd, eventfd to the back end, eventfd to the front end) as extras. A
// resuming front end (the Hello's resume flag) brings the ring and heap
// it had and gets the back end the image waiting for its domain holds.
// The back end serves the ring for as long as the connection lasts.
func (a *Aggregator) servePVDRM(ctx context.Context, p *ipc.Pending, log *slog.Logger) {
	h := p.Hello()
	files, err := dupFiles(p.Extra())
	if err != nil {
		_ = p.Reject("internal error: " + err.Error())
		return
	}
	t, err := pvdrm.AttachLocalBack(files)
	if err != nil {
		log.Warn("refused", "err", err)
		_ = p.Reject(err.Error())
		return
	}
	g := Guest{DomID: h.DomID, Name: h.Name, Mode: h.Mode, PID: p.Peer().PID}
	attach := a.AttachPVDRM
	if h.Resume {
		attach = a.AttachPVDRMRestored
	}
	b, err := attach(g, p.RAM(), h.RAMSize, t)
	if err != nil {
		log.Warn("refused", "err", err)
		_ = p.Reject(err.Error())
		_ = t.Close()
		return
	}
	v := b.VGPU()
	w := b.Welcome()
	w.Params = map[string]string{}
	if a.opts.Timing != "" {
		w.Params[ipc.ParamTiming] = a.opts.Timing
	}
	conn, err := p.Accept(w, nil)
	if err != nil {
		log.Warn("handshake failed", "err", err)
		_ = b.Close()
		return
	}
	v.onHangup(conn.End)
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- b.Serve(sctx) }()
	go func() {
		// A front end that breaks the ring loses its connection too.
		if err := <-served; err != nil {
			conn.End(err.Error())
		}
		served <- nil
	}()
	// A handoff's commit waits for this connection's end: its Bye must
	// be written before the exec closes the socket (handoff.go).
	connEnded := v.serving()
	err = conn.Serve(sctx, pvdrmConn{v})
	close(connEnded)
	stop()
	<-b.stopped
	log.Info("pvdrm front end gone", "reason", err)
	if derr := b.Close(); derr != nil {
		log.Error("teardown", "err", derr)
	}
	_ = conn.Close()
}

// dupFiles duplicates files (the connection keeps and closes its own).
func dupFiles(in []*os.File) ([]*os.File, error) {
	out := make([]*os.File, 0, len(in))
	for _, f := range in {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, g := range out {
				g.Close()
			}
			return nil, fmt.Errorf("dup: %w", err)
		}
		out = append(out, os.NewFile(uintptr(fd), f.Name()))
	}
	return out, nil
}
