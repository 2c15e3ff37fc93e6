package sim

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// A channel disabled and enabled again is a fresh one; with its state image
// restored it continues its ring at GP_GET with its method state, as a
// channel whose RAMFC and context were copied does.
func TestChannelStateSaveRestore(t *testing.T) {
	for _, restore := range []bool{false, true} {
		r := newRig(t)
		c := r.newChan(3, nil)
		pa := c.semPage()
		c.push(semRelease(chanDataVA, 5)...) // binds the semaphore address and payload
		c.mustFinish()
		r.w32(pa, 0)
		if _, err := r.b.SaveChannelState(c.id); err != nil {
			t.Fatalf("save of an enabled idle channel: %v", err)
		}
		r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(c.id)), 0)
		img, err := r.b.SaveChannelState(c.id)
		if err != nil {
			t.Fatal(err)
		}
		r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(c.id)), nvc0.ChanCtlDefault)
		if restore {
			// GP_GET past the ring (an image not of this channel) is
			// refused, and leaves the channel fresh for the real one.
			past := slices.Clone(img)
			_, entries := nvc0.GPFIFODecode(r.r32(c.ramin+nvc0.RAMINGPFIFOLo), r.r32(c.ramin+nvc0.RAMINGPFIFOHi))
			for _, get := range []uint32{entries, 0xFFFFFFFF} {
				past[2] = get
				if err := r.b.RestoreChannelState(c.id, past); err == nil {
					t.Fatalf("GP_GET %d restored into a ring of %d entries", get, entries)
				}
			}
			if err := r.b.RestoreChannelState(c.id, img); err != nil {
				t.Fatal(err)
			}
			if err := r.b.RestoreChannelState(c.id, img); !errors.Is(err, ErrChannelBusy) {
				t.Fatalf("second restore: %v, want ErrChannelBusy", err)
			}
		}
		if got := c.gpGet(); restore && got != 1 || !restore && got != 0 {
			t.Fatalf("restore %v: GP_GET %d after enable", restore, got)
		}
		// A release with the bound address and payload only: the trigger.
		c.push(nvc0.Incr(0, nvc0.MthdSemaphoreTrigger, 1), nvc0.SemaphoreRelease|nvc0.SemaphoreRelease4Byte)
		c.mustFinish()
		// Without the image the ring ran from entry 0 again (the first
		// release, 5, then the trigger with the same state); with it only
		// the trigger ran, from the restored state.
		if got := r.r32(pa); got != 5 {
			t.Fatalf("restore %v: semaphore %d, want 5", restore, got)
		}
		want := uint64(2)
		if restore {
			want = 1
		}
		if got := r.b.Stats().GPFIFOEntries - 1; got != want {
			t.Fatalf("restore %v: %d entries ran after enable, want %d", restore, got, want)
		}
	}
}

func TestChannelStateRefusesBusyChannels(t *testing.T) {
	r := newRig(t)
	c := r.newChan(1, nil)
	img, err := r.b.SaveChannelState(c.id)
	if err != nil {
		t.Fatal(err)
	}
	// Enabled with work given: a doorbell came first.
	r.list = nil
	r.submitPlaylist()
	c.push(semRelease(chanDataVA, 1)...)
	if _, err := r.b.SaveChannelState(c.id); !errors.Is(err, ErrChannelBusy) {
		t.Fatalf("save with work pending: %v", err)
	}
	if err := r.b.RestoreChannelState(c.id, img); !errors.Is(err, ErrChannelBusy) {
		t.Fatalf("restore into a channel with work: %v", err)
	}
	if err := r.b.RestoreChannelState(c.id, img[:3]); err == nil {
		t.Fatal("a short image was taken")
	}
}

func TestVRAMResidentRanges(t *testing.T) {
	const seg = 4 << 20
	r := newRigConfig(t, Config{VRAMSize: 3 * seg, VRAMSegments: []uint64{seg, seg, seg}, Channels: 8, MemPartitions: 4})
	base := uint64(seg)
	got, err := r.b.VRAMResidentRanges(base, seg)
	if err != nil || len(got) != 0 {
		t.Fatalf("fresh segment: %v %v", got, err)
	}
	r.hostWrite(base+0x3000, []byte{1})
	r.hostWrite(base+0x200000, make([]byte, 0x2000))
	r.hostWrite(base+0x200000, []byte{2})
	got, err = r.b.VRAMResidentRanges(base, seg)
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, g := range got {
		if g.Base < base || g.Base+g.Size > base+seg {
			t.Fatalf("range %#x+%#x outside the segment", g.Base, g.Size)
		}
		total += g.Size
	}
	covers := func(a uint64) bool {
		for _, g := range got {
			if a >= g.Base && a < g.Base+g.Size {
				return true
			}
		}
		return false
	}
	if !covers(base+0x3000) || !covers(base+0x201000) || total > 1<<20 {
		t.Fatalf("ranges %v (total %#x)", got, total)
	}
	if err := r.b.ScrubVRAM(base, seg); err != nil {
		t.Fatal(err)
	}
	if got, _ = r.b.VRAMResidentRanges(base, seg); len(got) != 0 {
		t.Fatalf("after scrub: %v", got)
	}
}

// Ranges inside one segment, and across segments, are listed too.
func TestVRAMResidentRangesWithinSegments(t *testing.T) {
	r := newRig(t)
	r.hostWrite(0x5000, []byte{1})
	got, err := r.b.VRAMResidentRanges(0x4000, 0x2000)
	if err != nil || len(got) != 1 || got[0].Base != 0x5000 || got[0].Size != 0x1000 {
		t.Fatalf("ranges %v, %v", got, err)
	}
	if got, _ := r.b.VRAMResidentRanges(0x6000, 0x10000); len(got) != 0 {
		t.Fatalf("ranges beyond the page: %v", got)
	}
}

// TestStopOfAFinishingRun: a channel is disabled and preempted (a host
// driver's stop, as a move's) just after its run published the last
// entry's GP_GET and before it looked at GP_PUT again — the moment the
// host sees the submission complete. The work is all done: the channel
// must read as having none pending, and its state must save. (The run's
// finding the ring empty was voided by the preempt, so the stopped
// channel kept its work-pending flag and a move failed with "channel is
// not idle", destroying the vGPU.)
func TestStopOfAFinishingRun(t *testing.T) {
	r := newRig(t)
	c := r.newChan(2, nil)
	stopped := make(chan struct{})
	var once sync.Once
	r.b.afterPublish = func(ch int) {
		if ch != c.id {
			return
		}
		once.Do(func() {
			r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(ch)), 0)
			r.b.Write32(nvc0.BAR0, nvc0.RegPreempt, uint32(ch))
			close(stopped)
		})
	}
	c.semPage()
	c.push(semRelease(chanDataVA, 1)...)
	<-stopped
	deadline := time.Now().Add(time.Minute) // a hang guard
	for r.b.Read32(nvc0.BAR0, nvc0.RegPreempt)&nvc0.PreemptPending != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the preempt never completed")
		}
		time.Sleep(time.Millisecond)
	}
	if got := c.gpGet(); got != c.put {
		t.Fatalf("GP_GET %d, GP_PUT %d: the entry did not complete", got, c.put)
	}
	if ctl := c.ctl(); ctl&nvc0.ChanCtlPending != 0 {
		t.Errorf("the stopped channel reads work pending (control %#x) with its ring empty", ctl)
	}
	if _, err := r.b.SaveChannelState(c.id); err != nil {
		t.Errorf("save of the stopped channel: %v", err)
	}
}

// TestSaveStoppedChannelWithALateDoorbell: a channel is stopped (disabled
// and preempted, a move's stop) and then its doorbell rings again — a guest
// writing the user area directly. Its state still saves, with GP_GET where
// the GPU stopped (the late entry not fetched), and the image runs the
// late entry once restored and rung again. (Refusing it destroyed a
// hostile VM's vGPU in the middle of an eviction.)
func TestSaveStoppedChannelWithALateDoorbell(t *testing.T) {
	r := newRig(t)
	c := r.newChan(3, nil)
	sem := c.semPage()
	c.push(semRelease(chanDataVA, 1)...)
	c.mustFinish()
	r.b.Write32(nvc0.BAR0, uint64(nvc0.ChanCtl(c.id)), 0)
	r.b.Write32(nvc0.BAR0, nvc0.RegPreempt, uint32(c.id))
	for deadline := time.Now().Add(time.Minute); r.b.Read32(nvc0.BAR0, nvc0.RegPreempt)&nvc0.PreemptPending != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the preempt never completed")
		}
		time.Sleep(time.Millisecond)
	}
	done := c.gpGet()
	c.push(semRelease(chanDataVA, 2)...) // rings the doorbell of the stopped channel
	img, err := r.b.SaveChannelState(c.id)
	if err != nil {
		t.Fatalf("save of a stopped channel with a late doorbell: %v", err)
	}
	if img[2] != done {
		t.Fatalf("saved GP_GET %d, want %d (where the GPU stopped)", img[2], done)
	}
	if got := r.r32(sem); got != 1 {
		t.Fatalf("the stopped channel ran the late entry: semaphore %d", got)
	}
}
