package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/host"
	"github.com/gpuvm/gpuvm/ipc"
)

// Upgrading `gpuvm serve` in place (docs/protocol.md §15, issue 18):
// SIGUSR2 makes the daemon hand its vGPUs to a new process in the same
// PID — the binary on disk, so an upgraded one is picked up — and the
// device models resume there. The daemon stops accepting device models
// (its sockets stay open, so newcomers wait in the backlog), parks every
// vGPU at a submission boundary and writes its state image into a memfd
// (aggregator.Hold), and only when every one is held ends each with a
// saved Bye and execs itself with the images, the sockets and a manifest
// of them inherited. Anything that fails before the exec lets every vGPU
// go on here; an exec that fails gives the images back to this process,
// where the device models resume as they would have on the new one.

// handoffEnv names the manifest's fd in the new process's environment.
const handoffEnv = "GPUVM_HANDOFF"

// handoffVersion is the manifest's version (§15.2): 2 hands the boards'
// VRAM over (§15.3). A manifest of version 1 (an upgrade from a gpuvm
// that wrote those) is read too: its images carry their VRAM.
const handoffVersion = 2

// handoffHoldTimeout bounds the wait for one vGPU's work in flight.
const handoffHoldTimeout = 30 * time.Second

// maxManifest bounds the manifest the new process reads.
const maxManifest = 4 << 20

// upgrader hands the daemon to a new process on SIGUSR2.
type upgrader struct {
	h   *host.Host
	log *slog.Logger
	ln  *ipc.Listener
	ctl *controlServer
	// exec replaces the process (syscall.Exec).
	exec func(argv0 string, argv, env []string) error
}

// handoffSignal catches SIGUSR2, the handoff's signal: from the daemon's
// start, so that one sent early (or to the new process as it starts) waits
// instead of killing it.
func handoffSignal() chan os.Signal {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR2)
	return sig
}

// watch hands the daemon off at each signal on sig until ctx is done; a
// handoff that fails is logged and the daemon goes on serving.
func (u *upgrader) watch(ctx context.Context, sig chan os.Signal) {
	defer signal.Stop(sig)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
			u.log.Info("handoff: SIGUSR2: handing the vGPUs to a new daemon process")
			if err := u.handOff(ctx); err != nil {
				u.log.Error("handoff failed: still serving here", "err", err)
			}
		}
	}
}

// heldVGPU is a vGPU held for the handoff and its image — or, hold nil,
// an image waiting for domain domid, its VRAM kept in slot kept (-1: the
// image carries it).
type heldVGPU struct {
	board string
	hold  *aggregator.HandoffHold
	domid uint32
	kept  int
	image *os.File
}

// handOff hands the daemon to a new process; it returns only if that did
// not happen, with every vGPU going on here.
func (u *upgrader) handOff(ctx context.Context) (err error) {
	start := time.Now()
	if b := u.h.HandoffBlockers(); len(b) > 0 {
		return fmt.Errorf("refused, nothing changed: %s (end those vGPUs first, or restart the daemon, which ends every vGPU)", strings.Join(b, "; "))
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("refused, nothing changed: the binary: %w", err)
	}
	if err := unix.Access(exe, unix.X_OK); err != nil {
		return fmt.Errorf("refused, nothing changed: the binary %s: %w", exe, err)
	}
	// No Xen pvdrm session starts from here on: none attaches a vGPU
	// that is not held.
	u.h.BeginXenPVDRMHandoff()
	sock, err := u.ln.HandOff()
	if err != nil {
		u.h.XenPVDRMHandoffEnded()
		return fmt.Errorf("the device socket: %w", err)
	}
	ctl, err := u.ctl.handOff()
	if err != nil {
		u.h.XenPVDRMHandoffEnded()
		return errors.Join(fmt.Errorf("the control socket: %w", err), u.ln.Resume(sock))
	}
	var held []heldVGPU
	committed := false
	defer func() {
		if err == nil {
			return
		}
		err = errors.Join(err, u.giveBack(held, committed))
		u.h.XenPVDRMHandoffEnded() // after the images are back: a Xen pvdrm device taken over again restores from one
		err = errors.Join(err, u.ln.Resume(sock), u.ctl.resume(ctl))
	}()
	held, err = u.holdAll(ctx, held)
	if err != nil {
		return err
	}
	waiting, err := u.waitingImages()
	defer func() {
		for _, w := range waiting {
			w.image.Close()
		}
	}()
	if err != nil {
		return err
	}
	vram, err := u.boardVRAM()
	defer func() {
		for _, b := range vram {
			for _, f := range b.files {
				f.Close()
			}
		}
	}()
	if err != nil {
		return err
	}
	manifest, err := u.manifest(sock, ctl, held, waiting, vram)
	if err != nil {
		return err
	}
	defer manifest.Close()
	var bytes uint64
	kept := 0
	for _, hv := range held {
		bytes += hv.hold.Stats.Bytes
		if hv.hold.Kept >= 0 {
			kept++
		}
	}
	pass := []*os.File{sock, ctl, manifest}
	for _, hv := range append(held, waiting...) {
		pass = append(pass, hv.image)
	}
	for _, b := range vram {
		pass = append(pass, b.files...)
	}
	if err := inheritable(pass, true); err != nil {
		return errors.Join(err, inheritable(pass, false))
	}
	committed = true
	isHeld := map[*aggregator.VGPU]bool{}
	for _, hv := range held {
		isHeld[hv.hold.VGPU()] = true
	}
	if err := u.h.HandOffXenPVDRM(func(v *aggregator.VGPU) bool { return isHeld[v] }); err != nil {
		// That device's front end finds its back end gone at the exec.
		u.log.Warn("handoff: a Xen pvdrm device could not be handed over", "err", err)
	}
	u.commitAll(held)
	u.log.Info("handoff: exec'ing the new daemon process", "binary", exe, "vgpus", len(held), "vram_kept_in_place", kept,
		"image_bytes", bytes, "took", time.Since(start))
	env := append(withoutEnv(os.Environ(), handoffEnv), handoffEnv+"="+strconv.Itoa(int(manifest.Fd())))
	xerr := u.exec(exe, os.Args, env)
	return errors.Join(fmt.Errorf("exec %s: %w", exe, xerr), inheritable(pass, false))
}

// commitAll ends every held vGPU with the saved Bye, all at once, and
// returns when every Bye is written.
func (u *upgrader) commitAll(held []heldVGPU) {
	var wg sync.WaitGroup
	for _, hv := range held {
		wg.Go(func() {
			if err := hv.hold.Commit(); err != nil {
				u.log.Warn("handoff: ending the handed-off vGPU", "vgpu", hv.hold.VGPU().ID, "err", err)
			}
		})
	}
	wg.Wait()
}

// holdAll holds every vGPU of every board, all at once (so that one
// vGPU's long work in flight does not add to the others' pause), and again
// until no new one attached meanwhile (a device model whose handshake
// ended as the socket was handed off). A vGPU gone meanwhile is left out.
func (u *upgrader) holdAll(ctx context.Context, held []heldVGPU) ([]heldVGPU, error) {
	seen := map[*aggregator.VGPU]bool{}
	for {
		type result struct {
			hv  heldVGPU
			err error
		}
		var mu sync.Mutex
		var results []result
		var wg sync.WaitGroup
		for _, b := range u.h.Boards() {
			for _, v := range b.Agg.VGPUs() {
				if seen[v] {
					continue
				}
				seen[v] = true
				wg.Go(func() {
					hv, err := holdOne(ctx, b, v, b.VRAMFiles != nil)
					mu.Lock()
					results = append(results, result{hv, err})
					mu.Unlock()
				})
			}
		}
		wg.Wait()
		if len(results) == 0 {
			return held, nil
		}
		var errs []error
		for _, r := range results {
			switch {
			case r.err == nil:
				held = append(held, r.hv)
			case !errors.Is(r.err, aggregator.ErrDetached):
				errs = append(errs, r.err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return held, err
		}
	}
}

// holdOne holds v of board b, its image in a new memfd; keepVRAM leaves
// its VRAM in its slot (the board's memory is handed over).
func holdOne(ctx context.Context, b *host.Board, v *aggregator.VGPU, keepVRAM bool) (heldVGPU, error) {
	f, err := memfd(fmt.Sprintf("gpuvm-handoff-vgpu-%d", v.ID))
	if err != nil {
		return heldVGPU{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, handoffHoldTimeout)
	defer cancel()
	w := bufio.NewWriterSize(f, 1<<20)
	hold, err := b.Agg.Hold(ctx, v, w, keepVRAM)
	if err == nil {
		if err = w.Flush(); err != nil {
			hold.Release()
			err = fmt.Errorf("hand off vGPU %d: writing the image: %w", v.ID, err)
		}
	}
	if err != nil {
		f.Close()
		return heldVGPU{}, err
	}
	return heldVGPU{board: hold.Board, hold: hold, image: f}, nil
}

// giveBack lets the held vGPUs go on here after a handoff that did not
// happen: released (parked, back at their next access), or, once their
// device models were told to resume (committed), restored here from their
// images as the new process would have.
func (u *upgrader) giveBack(held []heldVGPU, committed bool) error {
	var errs []error
	for _, hv := range held {
		v := hv.hold.VGPU()
		if !committed {
			hv.hold.Release()
		} else if err := u.restoreHere(hv); err != nil {
			errs = append(errs, fmt.Errorf("vGPU %d (%s, domid %d) lost: %w", v.ID, v.Guest.Name, v.Guest.DomID, err))
		}
		hv.image.Close()
	}
	if committed {
		u.log.Warn("handoff: the vGPUs resume on this process", "vgpus", len(held))
	}
	return errors.Join(errs...)
}

// restoreHere registers hv's image for its domain on this process.
func (u *upgrader) restoreHere(hv heldVGPU) error {
	v := hv.hold.VGPU()
	st, err := hv.image.Stat()
	if err != nil {
		return err
	}
	_, err = u.h.RegisterHandoff(v.Guest.DomID, hv.board, io.NewSectionReader(hv.image, 0, min(st.Size(), maxImage(u.h))), hv.hold.Kept)
	return err
}
