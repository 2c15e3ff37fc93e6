package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/ipc"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/host"
)

// The new daemon process's side of a handoff (handoff.go, docs/protocol.md
// §15): the manifest its predecessor left in the environment, the
// sockets it takes over and the images it registers before it serves.

// inherited is what a handoff left this process.
type inherited struct {
	m             handoffManifest
	sock, control *os.File
	images        []*os.File // by all()
	// vram are the boards' VRAM segments handed over, by board name
	// (§15.3); adopted, the boards built over them.
	vram    map[string][]*os.File
	adopted map[string]bool
	// keptSlots are the slots of each adopted board kept for an image.
	keptSlots map[string][]int
}

// inheritHandoff takes over what the previous process of this PID handed
// over ($GPUVM_HANDOFF); nil, nil when it was started afresh. Every
// inherited fd is made close-on-exec again, so none leaks to a child. A
// manifest that is unusable is an error; the Xen pvdrm devices it names,
// if it is this PID's, are returned all the same: the previous process
// disowned them, and the caller closes them (host.AbandonXenPVDRM).
func inheritHandoff() (in *inherited, orphans []host.XenPVDRMHandoff, err error) {
	in, raw, err := inheritManifest()
	if err != nil && raw != nil {
		var lenient struct {
			PID      int                    `json:"pid"`
			XenPVDRM []host.XenPVDRMHandoff `json:"xen_pvdrm"`
		}
		if json.Unmarshal(raw, &lenient) == nil && lenient.PID == os.Getpid() {
			orphans = lenient.XenPVDRM
		}
	}
	return in, orphans, err
}

// inheritManifest is inheritHandoff; it returns the manifest's bytes too
// (nil if it could not read them).
func inheritManifest() (*inherited, []byte, error) {
	v, ok := os.LookupEnv(handoffEnv)
	if !ok {
		return nil, nil, nil
	}
	os.Unsetenv(handoffEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, nil, fmt.Errorf("$%s=%q: not an inherited fd", handoffEnv, v)
	}
	unix.CloseOnExec(fd)
	mf := os.NewFile(uintptr(fd), "handoff-manifest")
	defer mf.Close()
	raw, err := io.ReadAll(io.NewSectionReader(mf, 0, maxManifest))
	if err != nil {
		return nil, nil, fmt.Errorf("handoff manifest: %w", err)
	}
	in := &inherited{}
	if err := decodeManifest(raw, &in.m); err != nil {
		return nil, raw, err
	}
	seen := map[int]bool{fd: true}
	file := func(fd int, name string) (*os.File, error) {
		if fd < 3 || seen[fd] {
			return nil, fmt.Errorf("handoff manifest: %s fd %d: not a distinct inherited fd", name, fd)
		}
		seen[fd] = true
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return nil, fmt.Errorf("handoff manifest: %s fd %d: %w", name, fd, err)
		}
		unix.CloseOnExec(fd)
		return os.NewFile(uintptr(fd), name), nil
	}
	var errs []error
	var ferr error
	if in.sock, ferr = file(in.m.Socket.FD, "device socket"); ferr != nil {
		errs = append(errs, ferr)
	}
	if in.control, ferr = file(in.m.Control.FD, "control socket"); ferr != nil {
		errs = append(errs, ferr)
	}
	for _, g := range in.all() {
		f, err := file(g.FD, fmt.Sprintf("image of domid %d", g.DomID))
		errs = append(errs, err)
		in.images = append(in.images, f)
	}
	in.vram, in.adopted, in.keptSlots = map[string][]*os.File{}, map[string]bool{}, map[string][]int{}
	for _, b := range in.m.Boards {
		if _, dup := in.vram[b.Name]; dup {
			errs = append(errs, fmt.Errorf("handoff manifest: board %s twice", b.Name))
			continue
		}
		var files []*os.File
		for i, s := range b.Segments {
			f, err := file(s.FD, fmt.Sprintf("VRAM segment %d of board %s", i, b.Name))
			errs = append(errs, err)
			if f != nil {
				files = append(files, f)
			}
		}
		in.vram[b.Name] = files
	}
	if err := errors.Join(errs...); err != nil {
		in.close()
		return nil, raw, err
	}
	return in, raw, nil
}

// decodeManifest decodes and checks a manifest: its version, and that it
// was handed to this very process (the same PID: an exec in place).
func decodeManifest(raw []byte, m *handoffManifest) error {
	if err := jsonStrict(raw, m); err != nil {
		return fmt.Errorf("handoff manifest: %w", err)
	}
	switch {
	case m.Version != 1 && m.Version != handoffVersion:
		return fmt.Errorf("handoff manifest version %d: this gpuvm reads versions 1 and %d", m.Version, handoffVersion)
	case m.Version == 1 && (len(m.Boards) != 0 || m.Host != nil):
		return errors.New("handoff manifest version 1 with boards' VRAM or the host's state: those are version 2's")
	case m.PID != os.Getpid():
		return fmt.Errorf("handoff manifest of process %d, not of this one (%d)", m.PID, os.Getpid())
	case m.Socket.Path == "" || m.Control.Path == "":
		return errors.New("handoff manifest: a socket without its path")
	}
	return nil
}

// register registers each inherited image for its domain on its board
// (host.RegisterHandoff, which checks it as any restore's), before the
// device models are accepted. A refused image is logged: its device model
// is refused when it asks.
func (in *inherited) register(h *host.Host, log *slog.Logger) {
	limit := maxImage(h)
	for i, g := range in.all() {
		f := in.images[i]
		var err error
		if st, serr := f.Stat(); serr != nil {
			err = serr
		} else if st.Size() > limit {
			err = fmt.Errorf("image of %d bytes: the boards take %d", st.Size(), limit)
		} else {
			err = in.registerOne(h, g, io.NewSectionReader(f, 0, st.Size()))
		}
		f.Close()
		in.images[i] = nil
		if err != nil {
			log.Error("handoff: a handed-over vGPU is lost", "domid", g.DomID, "name", g.Name, "board", g.Board, "err", err)
			continue
		}
		log.Info("handoff: vGPU image waits for its device model", "domid", g.DomID, "name", g.Name, "board", g.Board, "bytes", g.Bytes,
			"vram_in_place", g.Kept != nil && in.adopted[g.Board])
	}
	in.renewUnclaimed(h, log)
	in.closeVRAM()
}

// all are the inherited images: those that waited, then the vGPUs' — so
// that a running vGPU's image replaces one that waited for its domain.
func (in *inherited) all() []handoffVGPU {
	return append(slices.Clone(in.m.Waiting), in.m.VGPUs...)
}

// close closes whatever was inherited and not taken over.
func (in *inherited) close() {
	for _, f := range append([]*os.File{in.sock, in.control}, in.images...) {
		if f != nil {
			f.Close()
		}
	}
	in.closeVRAM()
}

// jsonStrict decodes raw into v, refusing unknown fields and trailing
// data.
func jsonStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the manifest")
	}
	return nil
}

// listenSockets listens on the device and control sockets — those a
// previous process handed over (whose images it registers first), or
// new ones.
func listenSockets(cfg config.Config, inh *inherited, h *host.Host, spin int, log *slog.Logger) (*ipc.Listener, net.Listener, error) {
	opts := &ipc.ListenOptions{Spin: spin}
	if inh == nil {
		ln, err := ipc.Listen(cfg.Daemon.Socket, opts)
		if err != nil {
			return nil, nil, err
		}
		// Created and owned as the device socket is: a live control
		// socket (another daemon's) is refused, never deleted.
		cln, err := ipc.ListenStream(cfg.Daemon.ControlSocket)
		if err != nil {
			ln.Close()
			return nil, nil, fmt.Errorf("control socket: %w", err)
		}
		return ln, cln, nil
	}
	if inh.m.Host != nil {
		for _, err := range h.ApplyHandoffState(*inh.m.Host) {
			log.Warn("handoff: not carried over", "err", err)
		}
	}
	inh.register(h, log)
	for _, err := range h.ResumeXenPVDRM(inh.m.XenPVDRM) {
		log.Error("handoff: a Xen pvdrm back end is lost", "err", err)
	}
	if inh.m.Socket.Path != cfg.Daemon.Socket || inh.m.Control.Path != cfg.Daemon.ControlSocket {
		log.Warn("handoff: the configuration names other sockets: they take effect at a restart", "serving", inh.m.Socket.Path,
			"control", inh.m.Control.Path)
	}
	ln, err := ipc.ListenFile(inh.m.Socket.Path, inh.sock, opts)
	inh.sock = nil
	if err != nil {
		inh.close()
		return nil, nil, err
	}
	cln, err := ipc.ListenStreamFile(inh.m.Control.Path, inh.control)
	inh.control = nil
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("control socket: %w", err)
	}
	log.Info("handoff: serving on the sockets the previous process handed over", "vgpus", len(inh.m.VGPUs))
	return ln, cln, nil
}
