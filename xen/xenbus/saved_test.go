package xenbus

import (
	"slices"
	"testing"
)

// TestSavedThenResumed follows a device across a save of its back end's
// state: the back end marks its directory saved and the front end reads
// the mark; the saved front end announces Initialising; a back end that
// restores the state offers the device with the resume flag, which also
// clears the saved mark; the front end's handshake runs again on it. A
// plain StartBack afterwards offers a fresh device (no resume flag), and a
// flag that is not 1 is refused.
func TestSavedThenResumed(t *testing.T) {
	s, front, back := newTestDevice(t)
	ctx := testCtx(t)
	f, b, _ := handshake(t, front, back, []uint32{100})
	if saved, err := f.PeerSaved(ctx); saved || err != nil {
		t.Fatalf("saved before any save: %v, %v", saved, err)
	}
	if err := b.MarkSaved(ctx); err != nil {
		t.Fatal(err)
	}
	if saved, err := f.PeerSaved(ctx); !saved || err != nil {
		t.Fatalf("the front end reads the saved mark as %v, %v", saved, err)
	}
	if err := f.Announce(ctx, StateInitialising); err != nil {
		t.Fatal(err)
	}

	// The restoring back end, and the front end's handshake again.
	done := make(chan error, 1)
	var r Ring
	go func() {
		rb, err := StartBackResuming(ctx, s.Connect(t, 0), testDevice(), testVersion)
		if err == nil {
			r, err = rb.WaitRing(ctx)
		}
		if err == nil {
			err = rb.Connect(ctx)
		}
		done <- err
	}()
	f2, err := StartFront(ctx, s.Connect(t, testDevice().FrontDomid), testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f2.PeerResumes(ctx); !ok || err != nil {
		t.Fatalf("the restoring back end's offer reads as resume %v, %v", ok, err)
	}
	if saved, err := f2.PeerSaved(ctx); saved || err != nil {
		t.Fatalf("the saved mark after the restoring back end started: %v, %v", saved, err)
	}
	if err := f2.Publish(ctx, []uint32{200}, 44); err != nil {
		t.Fatal(err)
	}
	if err := f2.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Refs, []uint32{200}) || r.Port != 44 {
		t.Fatalf("the restoring back end read %+v, want the ring granted again", r)
	}

	// A fresh back end clears the flag; a forged flag is refused.
	if _, err := StartBack(ctx, s.Connect(t, 0), testDevice(), testVersion); err != nil {
		t.Fatal(err)
	}
	if ok, err := f2.PeerResumes(ctx); ok || err != nil {
		t.Fatalf("a fresh back end's offer reads as resume %v, %v", ok, err)
	}
	for _, bad := range []string{"0", "2", "yes"} {
		if err := s.Connect(t, 0).Write(ctx, testDevice().BackendPath()+"/"+KeyResume, bad); err != nil {
			t.Fatal(err)
		}
		if _, err := f2.PeerResumes(ctx); err == nil {
			t.Errorf("resume flag %q accepted", bad)
		}
	}

	// A removed device is not marked (nor made again).
	if err := RemoveDevice(ctx, s.Connect(t, 0), testDevice()); err != nil {
		t.Fatal(err)
	}
	if err := b.MarkSaved(ctx); err == nil {
		t.Error("a removed device was marked saved")
	}
	if _, there := s.Get(testDevice().BackendPath() + "/" + KeySaved); there {
		t.Error("the saved mark was written into a removed device")
	}
}
