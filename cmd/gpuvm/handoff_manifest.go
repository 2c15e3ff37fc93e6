package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/host"
)

// What a handoff passes to the new process (docs/protocol.md §15.2): the
// manifest, the images' memfds, and the fds made inheritable.

// handoffManifest is §15.2's manifest: what the new process inherits.
type handoffManifest struct {
	Version int           `json:"version"`
	PID     int           `json:"pid"`
	Socket  handoffSocket `json:"socket"`
	Control handoffSocket `json:"control"`
	VGPUs   []handoffVGPU `json:"vgpus"`
	// Waiting are the images registered for a domain and not yet taken
	// (gpuvm vgpu restore): their VGPU is -1, Name and Mode empty.
	Waiting []handoffVGPU `json:"waiting"`
	// Boards are the boards whose VRAM is handed over (version 2).
	Boards []handoffBoard `json:"boards,omitempty"`
	// Host is the domains' registered settings and the boards cordoned
	// (version 2).
	Host *host.HandoffState `json:"host,omitempty"`
	// XenPVDRM are the Xen pvdrm back ends: the new process takes their
	// devices over (§15.5).
	XenPVDRM []host.XenPVDRMHandoff `json:"xen_pvdrm,omitempty"`
}

// handoffBoard is a board's VRAM handed over: its size and the memfd of
// each segment, in order (§15.3).
type handoffBoard struct {
	Name     string           `json:"name"`
	VRAM     uint64           `json:"vram"`
	Segments []handoffSegment `json:"segments"`
}

// handoffSegment is one VRAM segment's memfd.
type handoffSegment struct {
	Size uint64 `json:"size"`
	FD   int    `json:"fd"`
}

// handoffKept says where a vGPU's VRAM, which its image does not carry,
// is: in slot Slot of its board, segment Segment of the board's entry.
type handoffKept struct {
	Slot    int `json:"slot"`
	Segment int `json:"segment"`
}

// handoffSocket is an inherited listening socket and the path it is bound
// at.
type handoffSocket struct {
	Path string `json:"path"`
	FD   int    `json:"fd"`
}

// handoffVGPU is one vGPU's image, in the memfd FD.
type handoffVGPU struct {
	DomID uint32 `json:"domid"`
	Name  string `json:"name"`
	Mode  string `json:"mode"`
	Board string `json:"board"`
	VGPU  int    `json:"vgpu"`
	FD    int    `json:"fd"`
	Bytes int64  `json:"bytes"`
	// Kept: the VRAM is in place on the board (version 2); nil: the
	// image carries it.
	Kept *handoffKept `json:"vram_kept,omitempty"`
}

// boardVRAM is a board's VRAM segments, to hand over.
type boardVRAM struct {
	name  string
	vram  uint64
	sizes []uint64
	files []*os.File
}

// boardVRAM takes a file on each VRAM segment of every board that can
// hand its VRAM over (host.Board.VRAMFiles).
func (u *upgrader) boardVRAM() ([]boardVRAM, error) {
	var out []boardVRAM
	for _, b := range u.h.Boards() {
		if b.VRAMFiles == nil {
			continue
		}
		files, err := b.VRAMFiles()
		if err != nil {
			return out, fmt.Errorf("board %s: its VRAM: %w", b.Name, err)
		}
		var size uint64
		for _, n := range b.VRAMSegments {
			size += n
		}
		out = append(out, boardVRAM{name: b.Name, vram: size, sizes: b.VRAMSegments, files: files})
	}
	return out, nil
}

// waitingImages writes every image waiting for its domain into a memfd of
// its own (hold nil: nothing of a vGPU is held).
func (u *upgrader) waitingImages() ([]heldVGPU, error) {
	var out []heldVGPU
	for _, b := range u.h.Boards() {
		err := b.Agg.EncodeWaitingImages(func(domid uint32, kept int, enc func(io.Writer) error) error {
			f, err := memfd(fmt.Sprintf("gpuvm-handoff-waiting-%d", domid))
			if err != nil {
				return err
			}
			w := bufio.NewWriterSize(f, 1<<20)
			if err := errors.Join(enc(w), w.Flush()); err != nil {
				f.Close()
				return err
			}
			out = append(out, heldVGPU{board: b.Name, domid: domid, kept: kept, image: f})
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("board %s: %w", b.Name, err)
		}
	}
	return out, nil
}

// manifest writes §15.2's manifest into a new memfd.
func (u *upgrader) manifest(sock, ctl *os.File, held, waiting []heldVGPU, vram []boardVRAM) (*os.File, error) {
	st := u.h.HandoffState()
	m := handoffManifest{Version: handoffVersion, PID: os.Getpid(), Host: &st, XenPVDRM: u.h.XenPVDRMBacks(),
		Socket:  handoffSocket{Path: u.ln.Addr(), FD: int(sock.Fd())},
		Control: handoffSocket{Path: u.ctl.path, FD: int(ctl.Fd())}}
	for _, hv := range held {
		v := hv.hold.VGPU()
		st, err := hv.image.Stat()
		if err != nil {
			return nil, err
		}
		e := handoffVGPU{DomID: v.Guest.DomID, Name: v.Guest.Name, Mode: v.Guest.Mode, Board: hv.board,
			VGPU: v.ID, FD: int(hv.image.Fd()), Bytes: st.Size()}
		if k := hv.hold.Kept; k >= 0 {
			e.Kept = &handoffKept{Slot: k, Segment: aggregator.SlotSegment(k)}
		}
		m.VGPUs = append(m.VGPUs, e)
	}
	for _, b := range vram {
		e := handoffBoard{Name: b.name, VRAM: b.vram}
		for i, f := range b.files {
			e.Segments = append(e.Segments, handoffSegment{Size: b.sizes[i], FD: int(f.Fd())})
		}
		m.Boards = append(m.Boards, e)
	}
	for _, w := range waiting {
		st, err := w.image.Stat()
		if err != nil {
			return nil, err
		}
		e := handoffVGPU{DomID: w.domid, Board: w.board, VGPU: -1, FD: int(w.image.Fd()), Bytes: st.Size()}
		if w.kept >= 0 {
			e.Kept = &handoffKept{Slot: w.kept, Segment: aggregator.SlotSegment(w.kept)}
		}
		m.Waiting = append(m.Waiting, e)
	}
	f, err := memfd("gpuvm-handoff-manifest")
	if err != nil {
		return nil, err
	}
	if err := json.NewEncoder(f).Encode(m); err != nil {
		f.Close()
		return nil, fmt.Errorf("handoff manifest: %w", err)
	}
	return f, nil
}

// memfd makes a memfd (close on exec until the handoff clears that).
func memfd(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// inheritable clears (on) or sets close-on-exec on files.
func inheritable(files []*os.File, on bool) error {
	flag := unix.FD_CLOEXEC
	if on {
		flag = 0
	}
	var errs []error
	for _, f := range files {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, flag); err != nil {
			errs = append(errs, fmt.Errorf("%s: close-on-exec: %w", f.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// withoutEnv is env without name's entries.
func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, name+"=") {
			out = append(out, e)
		}
	}
	return out
}

// maxImage bounds an image any of h's boards takes.
func maxImage(h *host.Host) int64 {
	var n int64
	for _, b := range h.Boards() {
		n = max(n, b.Agg.MaxImageBytes())
	}
	return n
}
