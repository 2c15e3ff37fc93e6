package aggregator

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// reconnectingPort is a guest's BARs through whichever vGPU its device
// model is connected to: a restore on another daemon gives the same guest
// (its RAM, its driver) a new vGPU.
type reconnectingPort struct{ v atomic.Pointer[VGPU] }

func (p *reconnectingPort) Read32(bar int, off uint64) uint32 {
	return vgpuPort{p.v.Load()}.Read32(bar, off)
}
func (p *reconnectingPort) Write32(bar int, off uint64, val uint32) {
	vgpuPort{p.v.Load()}.Write32(bar, off, val)
}

// savedGuest is a VM whose vGPU can be saved and restored elsewhere.
type savedGuest struct {
	*guestVM
	port *reconnectingPort
	g    Guest
}

func startSavable(t testing.TB, agg *Aggregator, domid uint32, name, mode string) *savedGuest {
	t.Helper()
	ram, err := hostmem.New(name, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ram.Close() })
	g := Guest{DomID: domid, Name: name, Mode: mode}
	v := attachRAM(t, agg, g, ram)
	if v == nil {
		t.Fatal("attach refused")
	}
	port := &reconnectingPort{}
	port.v.Store(v)
	dev, err := nouveau.Open(port, ram, nouveau.Options{BAR1Size: v.Slot.BAR1.Size, BAR3Size: v.Slot.BAR3.Size, PV: driverPV(mode)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return &savedGuest{guestVM: &guestVM{ram: ram, v: v, dev: dev}, port: port, g: g}
}

// attachRAM attaches g over ram on agg: nil and the error if refused.
func attachRAM(t testing.TB, agg *Aggregator, g Guest, ram *hostmem.RAM) *VGPU {
	t.Helper()
	v, err := attachRAMErr(agg, g, ram)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	return v
}

func attachRAMErr(agg *Aggregator, g Guest, ram *hostmem.RAM) (*VGPU, error) {
	f, err := ram.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return agg.Attach(g, f, ram.Size())
}

// save saves s's vGPU on agg and returns the image; the vGPU is gone.
func (s *savedGuest) save(t *testing.T, agg *Aggregator) []byte {
	t.Helper()
	var b bytes.Buffer
	st, err := agg.Save(context.Background(), s.v, &b, false)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	if st.Bytes == 0 {
		t.Fatal("the image carries no VRAM")
	}
	if n := len(agg.VGPUs()); n != 0 {
		t.Fatalf("the saved vGPU is still attached on its board (%d vGPUs)", n)
	}
	return b.Bytes()
}

// honestBeside is a VM on agg whose marker must never be read or changed.
func honestBeside(t *testing.T, agg *Aggregator) (*guestVM, []uint32) {
	t.Helper()
	h := startGuestAs(t, agg, 40, "honest", "fv-optimized")
	marker := []uint32{0xC0FFEE00, 0xC0FFEE01, 0xC0FFEE02, 0xC0FFEE03}
	writeMarker(h.v, markerAt, marker)
	return h, marker
}

func checkHonest(t *testing.T, h *guestVM, marker []uint32) {
	t.Helper()
	for i, w := range readMarker(h.v, markerAt, len(marker)) {
		if w != marker[i] {
			t.Fatalf("the honest VM's marker word %d reads %#x, want %#x", i, w, marker[i])
		}
	}
	if c := h.v.Counters(); c.Denied != 0 {
		t.Fatalf("the honest VM had %d accesses denied", c.Denied)
	}
}

// savedScene is the two tests' scene: a source and a destination daemon,
// an honest VM with its marker on the destination, and on the source a VM
// in mode that ran verified madd and cpy and a madd in a context it keeps
// open (closed at the test's end).
func savedScene(t *testing.T, mode string, domid uint32, name string) (src, dst *Aggregator, honest *guestVM, marker []uint32, s *savedGuest, ctx *gdev.Context) {
	t.Helper()
	src, _ = newTestAggregator(t, 2)
	dst, _ = newTestAggregator(t, 2)
	honest, marker = honestBeside(t, dst)
	s = startSavable(t, src, domid, name, mode)
	return src, dst, honest, marker, s, s.computing(t)
}

// computing runs s's verified work and opens a context that ran a madd:
// what its guest must go on from after a save, a move or a handoff.
func (s *savedGuest) computing(t *testing.T) *gdev.Context {
	t.Helper()
	verifiedWork(t, s.guestVM)
	ctx, err := gdev.NewContext(s.dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	if err := maddOnce(ctx, 16); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// goesOn points s's guest at nv, the vGPU it was restored as (its device
// model reconnected), and checks that it goes on there: a madd in ctx,
// the context it opened before (what), then its verified work.
func (s *savedGuest) goesOn(t *testing.T, nv *VGPU, ctx *gdev.Context, what string) {
	t.Helper()
	s.port.v.Store(nv)
	s.v = nv
	if err := maddOnce(ctx, 16); err != nil {
		t.Fatalf("madd in the context opened before the %s: %v", what, err)
	}
	verifiedWork(t, s.guestVM)
}

// TestSaveRestoreOnAnotherDaemon: a VM runs verified madd and cpy, with a
// context (its channel) kept open; its vGPU is saved, and the image is
// restored on a second daemon (another board, another registry) beside an
// honest VM. The same guest — its RAM and driver, its device model
// reconnected — goes on: a madd in the context it opened before the save,
// then madd and cpy, all verified. The honest VM's marker is unchanged.
func TestSaveRestoreOnAnotherDaemon(t *testing.T) {
	for _, mode := range []string{"fv-optimized", "pv-multicall"} {
		t.Run(mode, func(t *testing.T) {
			src, dst, honest, marker, s, ctx := savedScene(t, mode, 5, "saved")
			img := s.save(t, src)
			t.Logf("image: %d bytes", len(img))
			info, err := dst.RegisterRestore(5, bytes.NewReader(img))
			if err != nil {
				t.Fatalf("register: %v", err)
			}
			if info.Mode != mode || len(dst.Restores()) != 1 {
				t.Fatalf("registered %+v; %d waiting", info, len(dst.Restores()))
			}
			nv := attachRAM(t, dst, s.g, s.ram)
			if len(dst.Restores()) != 0 || nv.Evicted() {
				t.Fatal("the image was not taken by the device model's attach, or the vGPU is still parked")
			}
			s.goesOn(t, nv, ctx, "save")
			if c := nv.Counters(); c.Denied != 0 {
				t.Fatalf("the restored guest had %d accesses denied", c.Denied)
			}
			checkHonest(t, honest, marker)
			verifiedWork(t, honest)
		})
	}
}

// edit decodes img, applies f and encodes it again: a well-formed image
// with a good checksum, so that only the restoring daemon's semantic
// checks can catch the edit.
func edit(t *testing.T, img []byte, f func(*vgpuimage.Image)) []byte {
	t.Helper()
	m, err := vgpuimage.Decode(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	f(m)
	var b bytes.Buffer
	if err := vgpuimage.Encode(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestRestoreRefusesHostileImages: images edited to name memory outside
// the new slot (a channel instance; a PV page-table entry pointing at the
// honest neighbour's slot), truncated, of version 2, with a bad checksum
// or carrying a register that is not plain storage are each refused —
// at registration or, for those only the rebuild can judge, at the attach,
// which then leaves nothing attached, no slot held, the domain free — and
// the honest VM beside them keeps its marker. A clean image of the same
// VM restores afterwards.
func TestRestoreRefusesHostileImages(t *testing.T) {
	for _, mode := range []string{"fv-optimized", "pv-multicall"} {
		t.Run(mode, func(t *testing.T) {
			src, dst, honest, marker, s, ctx := savedScene(t, mode, 6, "hostile")
			img := s.save(t, src)
			// The honest VM's marker as the restored vGPU's guest would
			// name it if its addresses were not checked: the restore takes
			// the other slot, and a guest VRAM address is an offset from
			// its slot's base (40 bits, wrapping).
			slots := dst.Layout().Slots
			restoredBase := slots[1-honest.v.Slot.Index].VRAM.Base
			neighbour := (slots[honest.v.Slot.Index].VRAM.Base + markerAt - restoredBase) & (1<<40 - 1)
			past := s.v.Slot.VRAM.Size + markerAt // just past its own slice

			registerRefused := map[string][]byte{
				"truncated":    img[:len(img)/2],
				"version 2":    func() []byte { b := bytes.Clone(img); b[8] = 2; return b }(),
				"bad checksum": func() []byte { b := bytes.Clone(img); b[len(b)-1] ^= 1; return b }(),
				"register not plain": edit(t, img, func(m *vgpuimage.Image) {
					m.Regs = append(m.Regs, vgpuimage.Reg{Off: nvc0.RegPlaylistSubmit, Val: 1})
					sortRegs(m.Regs)
				}),
			}
			for name, b := range registerRefused {
				if _, err := dst.RegisterRestore(6, bytes.NewReader(b)); err == nil {
					t.Fatalf("%s: registered", name)
				} else {
					t.Logf("%s: %v", name, err)
					if name == "version 2" && !strings.Contains(err.Error(), "image version 2: this gpuvm reads version 1") {
						t.Fatalf("version 2 refused as %v", err)
					}
				}
				if len(dst.Restores()) != 0 {
					t.Fatalf("%s: an image waits", name)
				}
			}

			attachRefused := map[string][]byte{
				"channel instance in the neighbour's slot": edit(t, img, func(m *vgpuimage.Image) {
					for i := range m.Chans {
						if m.Chans[i].Inst&nvc0.ChanInstValid != 0 {
							m.Chans[i].Inst = nvc0.InstEncode(neighbour, nvc0.ChanInstValid)
						}
					}
				}),
				"channel instance past the slice": edit(t, img, func(m *vgpuimage.Image) {
					for i := range m.Chans {
						if m.Chans[i].Inst&nvc0.ChanInstValid != 0 {
							m.Chans[i].Inst = nvc0.InstEncode(past, nvc0.ChanInstValid)
						}
					}
				}),
			}
			if mode == "pv-multicall" {
				attachRefused["page-table entry at the neighbour's slot"] = edit(t, img, func(m *vgpuimage.Image) {
					n := 0
					for _, o := range m.PV.Objects {
						for j, w := range o.Entries {
							if e := nvc0.DecodePTE(uint32(w), uint32(w>>32)); w != 0 && !e.IsSystem() {
								e.Addr = neighbour
								lo, hi := e.Encode()
								o.Entries[j] = uint64(lo) | uint64(hi)<<32
								n++
							}
						}
					}
					if n == 0 {
						t.Fatal("no VRAM page-table entry in the image to point elsewhere")
					}
				})
			}
			for name, b := range attachRefused {
				if _, err := dst.RegisterRestore(6, bytes.NewReader(b)); err != nil {
					t.Fatalf("%s: refused at registration (%v); only the rebuild can judge it", name, err)
				}
				v, err := attachRAMErr(dst, s.g, s.ram)
				if err == nil {
					t.Fatalf("%s: attached vGPU %d", name, v.ID)
				}
				t.Logf("%s: %v", name, err)
				if got := dst.VGPUs(); len(got) != 1 || got[0] != honest.v {
					t.Fatalf("%s: %d vGPUs attached after the refusal", name, len(got))
				}
				if dst.Room() != 1 || dst.Parked() != 0 {
					t.Fatalf("%s: room %d, parked %d after the refusal", name, dst.Room(), dst.Parked())
				}
				checkHonest(t, honest, marker)
			}
			// A device model of another mode is refused, the image dropped.
			if _, err := dst.RegisterRestore(6, bytes.NewReader(img)); err != nil {
				t.Fatal(err)
			}
			other := s.g
			other.Mode = "fv-naive"
			if _, err := attachRAMErr(dst, other, s.ram); err == nil || !errors.Is(err, ErrImageRefused) {
				t.Fatalf("a device model of another mode: %v", err)
			}
			// The clean image still restores, and the guest goes on.
			if _, err := dst.RegisterRestore(6, bytes.NewReader(img)); err != nil {
				t.Fatal(err)
			}
			nv := attachRAM(t, dst, s.g, s.ram)
			s.port.v.Store(nv)
			if err := maddOnce(ctx, 16); err != nil {
				t.Fatalf("madd after the clean restore: %v", err)
			}
			checkHonest(t, honest, marker)
			verifiedWork(t, honest)
		})
	}
}

func sortRegs(r []vgpuimage.Reg) {
	for i := 1; i < len(r); i++ {
		for j := i; j > 0 && r[j].Off < r[j-1].Off; j-- {
			r[j], r[j-1] = r[j-1], r[j]
		}
	}
}

// TestSaveRefusesPVDRMWithoutBackEnd: a vGPU of a pvdrm mode with no back
// end on it (its state is nowhere else) is refused at save, untouched. A
// pvdrm vGPU with its back end is saved (pvdrm_save_test.go).
func TestSaveRefusesPVDRMWithoutBackEnd(t *testing.T) {
	agg, _ := newTestAggregator(t, 1)
	v := &VGPU{ID: 1, Guest: Guest{Mode: "pvdrm"}}
	if _, err := agg.Save(context.Background(), v, &bytes.Buffer{}, false); !errors.Is(err, ErrSaveUnsupported) {
		t.Fatalf("save of a pvdrm vGPU: %v", err)
	}
}

// TestSaveQuotaVGPU: a vGPU whose quota narrows its slot's VRAM is saved
// with its own VRAM only — a page of the slot past the quota (written
// here from the host side: the guest has no way to it) is not in the
// image, which another daemon with the same quota takes and restores, and
// the guest verifies there.
func TestSaveQuotaVGPU(t *testing.T) {
	const quota = 128 << 20
	opts := Options{MaxVMs: 2, Quota: func(g Guest) Quota {
		if g.Name == "narrow" {
			return Quota{VRAM: quota}
		}
		return Quota{}
	}}
	src, board := newTestAggregatorWith(t, opts)
	dst, _ := newTestAggregatorWith(t, opts)
	s := startSavable(t, src, 5, "narrow", "fv-optimized")
	if s.v.Slot.VRAM.Size != quota {
		t.Fatalf("the vGPU has %d MiB of VRAM, want its quota", s.v.Slot.VRAM.Size>>20)
	}
	verifiedWork(t, s.guestVM)
	past := src.layout.Slots[s.v.Slot.Index].VRAM.Base + quota + 4096
	if err := board.WriteVRAM([]byte{0xAA, 0xBB, 0xCC, 0xDD}, past); err != nil {
		t.Fatal(err)
	}
	img := s.save(t, src)
	m, err := vgpuimage.Decode(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Pages {
		if p.Off+uint64(len(p.Data)) > quota {
			t.Fatalf("the image has a page at %#x+%#x, past the vGPU's %d MiB", p.Off, len(p.Data), quota>>20)
		}
	}
	if _, err := dst.RegisterRestore(5, bytes.NewReader(img)); err != nil {
		t.Fatalf("register: %v", err)
	}
	nv := attachRAM(t, dst, s.g, s.ram)
	s.port.v.Store(nv)
	s.v = nv
	verifiedWork(t, s.guestVM)
}
