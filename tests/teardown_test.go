package tests

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
	"golang.org/x/sys/unix"
)

func allZero(t *testing.T, e *env, base, size uint64) (bool, uint64) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for off := uint64(0); off < size; off += uint64(len(buf)) {
		if err := e.board.ReadVRAM(buf, base+off); err != nil {
			t.Fatal(err)
		}
		for i, b := range buf {
			if b != 0 {
				return false, base + off + uint64(i)
			}
		}
	}
	return true, 0
}

// TestKilledDeviceModel: a VM process SIGKILLed while it computes loses its
// vGPU (gone from the aggregator and the control API), its channels are off
// the board, and its slice is scrubbed: the next tenant of the slot reads
// zeros where the killed VM had data. The honest VM keeps computing.
func TestKilledDeviceModel(t *testing.T) {
	e := newEnv(t)
	honest, _ := e.startHonest(t)
	victim := e.startVM(t, "doomed", 12, "fv-naive", []string{"--workloads", "madd,cpy", "--runs", "100000", "--matrix-dim", "64", "--copy-size", "1MiB"})
	v := e.waitAttached(t, "doomed", victim)
	slot := v.Slot
	deadline := time.Now().Add(20 * time.Second)
	for v.Counters().Doorbells < 20 && time.Now().Before(deadline) && !victim.exited() {
		time.Sleep(5 * time.Millisecond)
	}
	if victim.exited() || v.Counters().Doorbells < 20 {
		t.Fatalf("the doomed VM never got going (exited %v)\nstderr:\n%s", victim.exited(), victim.stderr())
	}
	// Its own data, plus a known pattern at the top of its slice.
	secret := pattern(0xE7, 64<<10)
	secretAt := slot.VRAM.End() - 1<<20
	e.writeVRAM(t, secretAt, secret)
	if zero, _ := allZero(t, e, slot.VRAM.Base, slot.VRAM.Size-1<<20); zero {
		t.Fatalf("the doomed VM wrote nothing to its slice: the scrub check below would prove nothing")
	}
	victim.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.done
	killed := time.Now()
	e.waitDetached(t, "doomed", 10*time.Second)
	t.Logf("vGPU torn down %v after SIGKILL", time.Since(killed).Round(time.Millisecond))

	srv := httptest.NewServer(e.agg.ControlHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/vgpus")
	if err != nil {
		t.Fatal(err)
	}
	var infos []aggregator.VGPUInfo
	err = json.NewDecoder(resp.Body).Decode(&infos)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == "doomed" {
			t.Errorf("the control API still lists the killed VM: %+v", in)
		}
	}
	for i := range slot.Chans {
		p := slot.ChanBase + i
		if inst, ctl := e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanInst(p))), e.board.Read32(nvc0.BAR0, uint64(nvc0.ChanCtl(p))); inst != 0 || ctl&nvc0.ChanCtlEnable != 0 {
			t.Errorf("physical channel %d of the killed VM: instance %#x control %#x", p, inst, ctl)
		}
	}
	if zero, at := allZero(t, e, slot.VRAM.Base, slot.VRAM.Size); !zero {
		t.Errorf("the killed VM's slice is not scrubbed: VRAM %#x is non-zero", at)
	}
	// The next tenant gets the same slot and sees zeros.
	// The next tenant of the slot (the honest VM may have finished and freed
	// another slot meanwhile: attach until one lands in the killed VM's).
	var next *devmodel.Device
	for i := 0; i < maxVMs && next == nil; i++ {
		name := fmt.Sprintf("next%d", i)
		d := e.connect(t, name, uint32(13+i), "fv-naive")
		if nv := e.vgpu(name); nv != nil && nv.Slot.Index == slot.Index {
			next = d
		}
	}
	if next == nil {
		t.Fatalf("no new tenant got the freed slot %d", slot.Index)
	}
	r := raw{next}
	for _, g := range []uint64{secretAt - slot.VRAM.Base, secretAt - slot.VRAM.Base + 0x8000, 1 << 20, 2 << 20, 8 << 20} {
		for k := uint64(0); k < 4; k++ {
			if got := r.vramRead32(g + 4*k); got != 0 {
				t.Errorf("the next tenant reads %#x at guest %#x: the killed VM's data", got, g+4*k)
			}
		}
	}
	honest.verified(t)
}

// TestStaleRemapMapping: with BAR remap, a device model receives its VRAM
// slice's memfd and maps it. After it disconnects (its vGPU torn down, the
// slot given to the next VM), that mapping must not reach the next tenant's
// VRAM.
func TestStaleRemapMapping(t *testing.T) {
	e := newEnv(t)
	ram, err := ipc.CreateMemfd("evil-ram", guestRAM)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, w, extra, err := ipc.Dial(ctx, e.sock, ipc.Hello{DomID: 50, Name: "evil", Mode: "fv-bar-remap", RAMSize: guestRAM, Transport: ipc.TransportShm}, ram, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w.Params[ipc.ParamRemap] != "1" || len(extra) != 2 {
		t.Fatalf("remap mode: params %v, %d extra files", w.Params, len(extra))
	}
	slot := e.vgpu("evil").Slot
	slice, err := unix.Mmap(int(extra[1].Fd()), 0, int(slot.VRAM.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	for _, f := range extra {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(slice)
	c.Close()
	e.waitDetached(t, "evil", 10*time.Second)

	next := e.connect(t, "next", 51, "fv-naive")
	if nv := e.vgpu("next"); nv == nil || nv.Slot.Index != slot.Index {
		t.Fatalf("the next tenant did not get slot %d", slot.Index)
	}
	r := raw{next}
	const g = 0x500000
	r.vramWrite32(g, 0x5EC2E7)
	r.sync()
	readByOld := binary.LittleEndian.Uint32(slice[g:])
	binary.LittleEndian.PutUint32(slice[g+4:], 0xBAD)
	writtenByOld := r.vramRead32(g + 4)
	if readByOld == 0x5EC2E7 || writtenByOld == 0xBAD {
		t.Fatalf("a disconnected remap-mode device model keeps read-write access to its old VRAM slice: "+
			"the next tenant's write of 0x5ec2e7 at guest %#x read %#x through the stale mapping, and the stale mapping's "+
			"write reads back %#x in the next tenant (aggregator/serve.go sliceFile + gpu/sim ScrubVRAM: the segment memfd "+
			"is reused across tenants; scrubbing punches holes but does not revoke other processes' mappings)",
			g, readByOld, writtenByOld)
	}
}
