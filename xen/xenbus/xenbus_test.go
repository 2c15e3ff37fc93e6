package xenbus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/xenstore"
	"github.com/gpuvm/gpuvm/xen/xenstore/xenstoretest"
)

// testVersion is the protocol version both ends speak in the tests.
const testVersion = 1

// testDevice is front domain 5's vtest device 0, backed by dom0.
func testDevice() Device { return Device{Type: "vtest", FrontDomid: 5, BackDomid: 0, DevID: 0} }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newTestDevice starts a test xenstored, creates the device as the
// toolstack does, and returns the store and a connection per end.
func newTestDevice(t *testing.T) (s *xenstoretest.Server, front, back *xenstore.Client) {
	t.Helper()
	s = xenstoretest.NewServer()
	if err := CreateDevice(testCtx(t), s.Connect(t, 0), testDevice()); err != nil {
		t.Fatal(err)
	}
	return s, s.Connect(t, testDevice().FrontDomid), s.Connect(t, testDevice().BackDomid)
}

func TestDevicePaths(t *testing.T) {
	d := Device{Type: "pvdrm", FrontDomid: 7, BackDomid: 3, DevID: 2}
	if d.FrontendPath() != "/local/domain/7/device/pvdrm/2" || d.BackendPath() != "/local/domain/3/backend/pvdrm/7/2" {
		t.Fatal(d.FrontendPath(), d.BackendPath())
	}
	if d.check() != nil {
		t.Fatal(d.check())
	}
	if (Device{Type: "pvdrm", FrontDomid: xen.DomidFirstReserved}).check() == nil {
		t.Fatal("reserved domid accepted")
	}
	for _, typ := range []string{"", "a/b", "a b", "..", "é"} {
		if (Device{Type: typ}).check() == nil {
			t.Errorf("device type %q accepted", typ)
		}
	}
}

func TestCreateDevice(t *testing.T) {
	s, _, _ := newTestDevice(t)
	fp, bp := testDevice().FrontendPath(), testDevice().BackendPath()
	for p, want := range map[string]string{
		fp + "/backend": bp, fp + "/backend-id": "0", fp + "/state": "1",
		bp + "/frontend": fp, bp + "/frontend-id": "5", bp + "/state": "1", bp + "/online": "1",
	} {
		if v, _ := s.Get(p); v != want {
			t.Errorf("%s = %q, want %q", p, v, want)
		}
	}
	fperm, bperm := strings.Join(s.Perms(fp), ","), strings.Join(s.Perms(bp), ",")
	if fperm != "n5,r0" || bperm != "n0,r5" {
		t.Errorf("permissions %q and %q", fperm, bperm)
	}
}

// handshake runs both ends to Connected and returns them.
func handshake(t *testing.T, front, back *xenstore.Client, refs []uint32) (*Front, *Back, Ring) {
	t.Helper()
	ctx := testCtx(t)
	type backResult struct {
		b   *Back
		r   Ring
		err error
	}
	done := make(chan backResult, 1)
	go func() {
		b, err := StartBack(ctx, back, testDevice(), testVersion)
		if err != nil {
			done <- backResult{err: err}
			return
		}
		r, err := b.WaitRing(ctx)
		if err == nil {
			err = b.Connect(ctx)
		}
		done <- backResult{b, r, err}
	}()
	f, err := StartFront(ctx, front, testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version() != testVersion || f.MaxRingPages() != 1<<MaxRingPageOrder || f.Device() != testDevice() {
		t.Fatalf("front sees version %d, %d pages, %+v", f.Version(), f.MaxRingPages(), f.Device())
	}
	if err := f.Publish(ctx, refs, 33); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	br := <-done
	if br.err != nil {
		t.Fatal(br.err)
	}
	return f, br.b, br.r
}

func TestHandshake(t *testing.T) {
	for _, refs := range [][]uint32{{8}, {100, 101, 102, 103}, {9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 4294967295}} {
		t.Run(fmt.Sprint(len(refs), " pages"), func(t *testing.T) {
			s, front, back := newTestDevice(t)
			ctx := testCtx(t)
			f, b, r := handshake(t, front, back, refs)
			if !slices.Equal(r.Refs, refs) || r.Port != 33 || r.Version != testVersion {
				t.Fatalf("back end read %+v", r)
			}
			fp := testDevice().FrontendPath()
			if len(refs) > 1 {
				if v, _ := s.Get(fp + "/ring-page-order"); v == "" {
					t.Fatal("no ring-page-order")
				}
			} else if v, _ := s.Get(fp + "/ring-ref"); v != "8" {
				t.Fatalf("ring-ref %q", v)
			}
			if st, err := b.PeerState(ctx); err != nil || st != StateConnected {
				t.Fatalf("back sees the front %v, %v", st, err)
			}

			// The front end closes: it waits until the back end let go.
			closing := make(chan error, 1)
			go func() { closing <- f.Closing(ctx) }()
			if st, err := b.WaitPeerClosing(ctx); err != nil || st != StateClosing {
				t.Fatalf("back end saw %v, %v", st, err)
			}
			select {
			case err := <-closing:
				t.Fatalf("front end finished Closing while the back end was Connected: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
			if err := b.Closing(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-closing; err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(b.Closed(ctx), f.Closed(ctx)); err != nil {
				t.Fatal(err)
			}
			var fs, bs []string
			for _, e := range s.StateLog() {
				dir, st, _ := strings.Cut(e, "=")
				switch dir {
				case fp:
					fs = append(fs, st)
				case testDevice().BackendPath():
					bs = append(bs, st)
				}
			}
			if got := strings.Join(fs, ","); got != "1,1,3,4,5,6" {
				t.Errorf("front states %s", got)
			}
			if got := strings.Join(bs, ","); got != "1,2,4,5,6" {
				t.Errorf("back states %s", got)
			}
			if err := RemoveDevice(ctx, s.Connect(t, 0), testDevice()); err != nil {
				t.Fatal(err)
			}
			if err := f.Closed(ctx); err != nil {
				t.Fatal("Closed after the device was removed:", err)
			}
			if err := switchState(ctx, front, fp, StateConnected, nil); !isNotExist(err) {
				t.Fatalf("switching a removed device: %v", err)
			}
			if _, there := s.Get(fp + "/state"); there {
				t.Fatal("a removed device was recreated")
			}
		})
	}
}

// TestBackRefusesFront has a hostile front end write what it likes
// where the back end reads: every value is refused, with the key named.
func TestBackRefusesFront(t *testing.T) {
	fp := testDevice().FrontendPath()
	good := map[string]string{"protocol-version": "1", "ring-ref": "8", "event-channel": "33", "state": "3"}
	for _, tc := range []struct{ key, val string }{
		{"ring-ref", "0x10"}, {"ring-ref", "-1"}, {"ring-ref", "007"}, {"ring-ref", " 12"},
		{"ring-ref", "4294967296"}, {"ring-ref", "7"}, {"ring-ref", ""}, {"ring-ref", "1\x002"},
		{"event-channel", "0"}, {"event-channel", "131072"}, {"event-channel", "33 "},
		{"protocol-version", "0"}, {"protocol-version", "2"},
		{"ring-page-order", "5"}, {"ring-page-order", "1"}, // order 1 without ring-ref0/1
	} {
		t.Run(tc.key+"="+tc.val, func(t *testing.T) {
			s, _, back := newTestDevice(t)
			ctx := testCtx(t)
			b, err := StartBack(ctx, back, testDevice(), testVersion)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range good {
				s.Set(fp+"/"+k, v)
			}
			s.Set(fp+"/"+tc.key, tc.val)
			_, err = b.WaitRing(ctx)
			if err == nil || !strings.Contains(err.Error(), "ring-ref") && !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("accepted, or no key named: %v", err)
			}
			t.Log(err)
		})
	}
}

func TestPeerChecks(t *testing.T) {
	fp, bp := testDevice().FrontendPath(), testDevice().BackendPath()
	for _, tc := range []struct {
		path, val string
		front     bool // the front end must refuse it, else the back end
	}{
		{fp + "/backend", "/local/domain/0/backend/vbd/5/0", true},
		{fp + "/backend-id", "32752", true},
		{fp + "/backend-id", "1", true}, // disagrees with backend
		{fp + "/backend-id", "00", true},
		{bp + "/frontend", "/local/domain/6/device/vtest/0", false},
		{bp + "/frontend-id", "6", false},
	} {
		t.Run(tc.path+"="+tc.val, func(t *testing.T) {
			s, front, back := newTestDevice(t)
			ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
			defer cancel()
			s.Set(tc.path, tc.val)
			var err error
			if tc.front {
				_, err = StartFront(ctx, front, testDevice(), testVersion)
			} else {
				_, err = StartBack(ctx, back, testDevice(), testVersion)
			}
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("accepted: %v", err)
			}
			t.Log(err)
		})
	}
}

func TestPeerCloses(t *testing.T) {
	s, front, back := newTestDevice(t)
	ctx := testCtx(t)
	b, err := StartBack(ctx, back, testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	f, err := StartFront(ctx, front, testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Publish(ctx, []uint32{8}, 1); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		_ = b.Closing(ctx) // the back end gives up instead of connecting
	}()
	if err := f.WaitConnected(ctx); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("front end waiting for a closing back end: %v", err)
	}
	// A front end that closes while the back end waits for its ring.
	s.Set(testDevice().FrontendPath()+"/state", "5")
	if _, err := b.WaitRing(ctx); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("back end waiting for a closing front end: %v", err)
	}
	if err := f.Publish(ctx, []uint32{8, 9, 10}, 1); err == nil {
		t.Fatal("three ring pages accepted")
	}
	if err := f.Publish(ctx, []uint32{8}, xen.EvtchnPortMax+1); err == nil {
		t.Fatal("port out of range accepted")
	}
}

func TestWaitIsBounded(t *testing.T) {
	_, front, back := newTestDevice(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	// No back end runs: the front end waits for InitWait until ctx ends.
	if _, err := StartFront(ctx, front, testDevice(), testVersion); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// The connection ends while the back end waits.
	b, err := StartBack(testCtx(t), back, testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(10 * time.Millisecond); back.Close() }()
	if _, err := b.WaitRing(testCtx(t)); !errors.Is(err, xenstore.ErrClosed) {
		t.Fatalf("got %v", err)
	}
}

func TestSelfDomid(t *testing.T) {
	s := xenstoretest.NewServer()
	xs := s.Connect(t, 5)
	ctx := testCtx(t)
	if _, err := SelfDomid(ctx, xs); !isNotExist(err) {
		t.Fatalf("no domid key: %v", err)
	}
	s.Set("/local/domain/5/domid", "5")
	if id, err := SelfDomid(ctx, xs); err != nil || id != 5 {
		t.Fatalf("domid %d, %v", id, err)
	}
	s.Set("/local/domain/5/domid", "65535")
	if _, err := SelfDomid(ctx, xs); err == nil {
		t.Fatal("reserved domid accepted")
	}
}

func TestStateString(t *testing.T) {
	if StateInitWait.String() != "InitWait" || State(9).String() != "State(9)" {
		t.Fatal("state names")
	}
}

// TestVersions: each end passes the highest protocol version it speaks;
// the front end settles on the lower of the two, and a back end reads the
// agreed version back.
func TestVersions(t *testing.T) {
	for _, tc := range []struct{ front, back, agreed uint32 }{{2, 3, 2}, {5, 1, 1}, {4, 4, 4}} {
		_, front, back := newTestDevice(t)
		ctx := testCtx(t)
		b, err := StartBack(ctx, back, testDevice(), tc.back)
		if err != nil {
			t.Fatal(err)
		}
		f, err := StartFront(ctx, front, testDevice(), tc.front)
		if err != nil {
			t.Fatal(err)
		}
		if f.Version() != tc.agreed {
			t.Fatalf("front %d, back %d: agreed on %d", tc.front, tc.back, f.Version())
		}
		if err := f.Publish(ctx, []uint32{8}, 1); err != nil {
			t.Fatal(err)
		}
		if r, err := b.WaitRing(ctx); err != nil || r.Version != tc.agreed {
			t.Fatalf("front %d, back %d: back end read %+v, %v", tc.front, tc.back, r, err)
		}
	}
	_, front, back := newTestDevice(t)
	if _, err := StartFront(testCtx(t), front, testDevice(), 0); err == nil {
		t.Fatal("front end of version 0")
	}
	if _, err := StartBack(testCtx(t), back, testDevice(), 0); err == nil {
		t.Fatal("back end of version 0")
	}
}

// TestExtraKeys: a front end's device-specific keys reach the back end in
// the ring's transaction, checked against the back end's bounds; a key
// out of bounds or missing fails the back end's read, and names the
// handshake uses are refused on both sides.
func TestExtraKeys(t *testing.T) {
	for _, tc := range []struct {
		name    string
		publish []Extra
		want    []ExtraKey
		ok      bool
	}{
		{"in bounds", []Extra{{"heap-ref", 8}, {"heap-pages", 4096}}, []ExtraKey{{"heap-ref", 8, 1<<32 - 1}, {"heap-pages", 1, 4096}}, true},
		{"past the bound", []Extra{{"heap-pages", 4097}}, []ExtraKey{{"heap-pages", 1, 4096}}, false},
		{"missing", nil, []ExtraKey{{"heap-pages", 1, 4096}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, front, back := newTestDevice(t)
			ctx := testCtx(t)
			b, err := StartBack(ctx, back, testDevice(), testVersion)
			if err != nil {
				t.Fatal(err)
			}
			f, err := StartFront(ctx, front, testDevice(), testVersion)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Publish(ctx, []uint32{8}, 3, tc.publish...); err != nil {
				t.Fatal(err)
			}
			r, err := b.WaitRing(ctx, tc.want...)
			if (err == nil) != tc.ok {
				t.Fatalf("WaitRing: %v (want ok %v)", err, tc.ok)
			}
			if err != nil {
				t.Logf("refused: %v", err)
				return
			}
			for _, e := range tc.publish {
				if r.Extra[e.Key] != e.Value {
					t.Fatalf("%s = %d, want %d", e.Key, r.Extra[e.Key], e.Value)
				}
			}
			// And back: what the back end says with Connected.
			if err := b.Connect(ctx, Extra{"vram-size", 256 << 20}); err != nil {
				t.Fatal(err)
			}
			if err := f.WaitConnected(ctx); err != nil {
				t.Fatal(err)
			}
			got, err := f.ReadPeer(ctx, ExtraKey{"vram-size", 1, 1 << 40})
			if err != nil || got["vram-size"] != 256<<20 {
				t.Fatalf("ReadPeer: %v, %v", got, err)
			}
			if _, err := f.ReadPeer(ctx, ExtraKey{"vram-size", 1, 1 << 20}); err == nil {
				t.Fatal("ReadPeer took a value past its bound")
			}
		})
	}
	_, front, back := newTestDevice(t)
	ctx := testCtx(t)
	b, err := StartBack(ctx, back, testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	f, err := StartFront(ctx, front, testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ring-ref", "ring-ref0", "event-channel", "state", "online", "frontend-id", "Heap", "a/b", ""} {
		if err := f.Publish(ctx, []uint32{8}, 3, Extra{key, 1}); err == nil {
			t.Errorf("front end published extra key %q", key)
		}
		if _, err := b.WaitRing(ctx, ExtraKey{key, 0, 1}); err == nil {
			t.Errorf("back end read extra key %q", key)
		}
	}
}

// TestResumeBack: a new back-end process takes over a Connected device
// without the front end seeing a state change, reading the ring it
// published; a back end not Connected (InitWait: the handshake was under
// way) is ErrNotConnected, a back end that cannot serve it closes it
// (CloseBack), and a directory naming another front end is refused as
// StartBack refuses it.
func TestResumeBack(t *testing.T) {
	s, front, back := newTestDevice(t)
	ctx := testCtx(t)
	if _, err := ResumeBack(ctx, back, testDevice(), testVersion); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("resume of a device in state Initialising: %v", err)
	}
	_, _, r := handshake(t, front, back, []uint32{100, 101})
	before := len(s.StateLog())
	b, err := ResumeBack(ctx, s.Connect(t, 0), testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.WaitRing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r2.Refs, r.Refs) || r2.Port != r.Port || r2.Version != r.Version {
		t.Fatalf("the resumed back end read %+v, the first %+v", r2, r)
	}
	if log := s.StateLog(); len(log) != before {
		t.Fatalf("the resume switched states: %v", log[before:])
	}
	// A front end that left meanwhile gets the handshake, not a resume.
	fp := testDevice().FrontendPath()
	if err := s.Connect(t, 0).Write(ctx, fp+"/state", "6"); err != nil {
		t.Fatal(err)
	}
	if _, err := ResumeBack(ctx, back, testDevice(), testVersion); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("resume under a Closed front end: %v", err)
	}
	// A back end that cannot serve it closes it: the front end reads
	// Closed.
	if err := CloseBack(ctx, s.Connect(t, 0), testDevice()); err != nil {
		t.Fatal(err)
	}
	if st, err := (&end{xs: front, own: testDevice().FrontendPath(), peer: testDevice().BackendPath()}).PeerState(ctx); err != nil || st != StateClosed {
		t.Fatalf("the front end sees the closed back end %v, %v", st, err)
	}
	bp := testDevice().BackendPath()
	if err := s.Connect(t, 0).Write(ctx, bp+"/frontend-id", "9"); err != nil {
		t.Fatal(err)
	}
	if _, err := ResumeBack(ctx, back, testDevice(), testVersion); err == nil || errors.Is(err, ErrNotConnected) {
		t.Fatalf("resume of a device whose directory names another front end: %v", err)
	}
}

// TestHandoffMark: a back end marked handed over says so to its front end
// with the takeover's bound, the process that takes it over clears the
// mark (twice is no error), and a front end refuses a mark that is not a
// number of seconds in 1..3600.
func TestHandoffMark(t *testing.T) {
	s, front, back := newTestDevice(t)
	ctx := testCtx(t)
	f, b, _ := handshake(t, front, back, []uint32{100})
	if _, ok, err := f.PeerHandoff(ctx); ok || err != nil {
		t.Fatalf("a mark before any handoff: %v, %v", ok, err)
	}
	if err := b.MarkHandoff(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	m, ok, err := f.PeerHandoff(ctx)
	if !ok || err != nil || m.Within != 2*time.Minute || m.ID == "" {
		t.Fatalf("the front end reads the mark as %+v, %v, %v", m, ok, err)
	}
	if err := b.MarkHandoff(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if m2, _, _ := f.PeerHandoff(ctx); m2.ID == m.ID {
		t.Errorf("a mark written again keeps its id %q", m.ID)
	}
	if err := b.MarkHandoff(ctx, 2*time.Hour); err == nil {
		t.Error("a two-hour bound was written")
	}
	r, err := ResumeBack(ctx, s.Connect(t, 0), testDevice(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := r.ClearHandoff(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := f.PeerHandoff(ctx); ok || err != nil {
		t.Fatalf("the mark after the takeover: %v, %v", ok, err)
	}
	for _, bad := range []string{"0", "3601", "soon"} {
		if err := s.Connect(t, 0).Write(ctx, testDevice().BackendPath()+"/"+KeyHandoff, bad); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.PeerHandoff(ctx); err == nil {
			t.Errorf("mark %q accepted", bad)
		}
	}
}
