package pvdrm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// testDevice is front domain 5's device 0, backed by dom0.
func testDevice() XenDevice { return XenDevice{FrontDomid: 5, BackDomid: 0, DevID: 0} }

// newTestDevice starts a test xenstored, creates the device as the
// toolstack does, and returns the store and a connection per end.
func newTestDevice(t *testing.T) (s *testXenstored, front, back *Xenstore) {
	t.Helper()
	s = newTestXenstored()
	if err := CreateXenDevice(testCtx(t), s.connect(t, 0), testDevice()); err != nil {
		t.Fatal(err)
	}
	return s, s.connect(t, testDevice().FrontDomid), s.connect(t, testDevice().BackDomid)
}

func TestXenDevicePaths(t *testing.T) {
	d := XenDevice{FrontDomid: 7, BackDomid: 3, DevID: 2}
	if d.FrontendPath() != "/local/domain/7/device/pvdrm/2" || d.BackendPath() != "/local/domain/3/backend/pvdrm/7/2" {
		t.Fatal(d.FrontendPath(), d.BackendPath())
	}
	if (XenDevice{FrontDomid: DomidFirstReserved}).check() == nil {
		t.Fatal("reserved domid accepted")
	}
}

func TestXenbusCreateDevice(t *testing.T) {
	s, _, _ := newTestDevice(t)
	fp, bp := testDevice().FrontendPath(), testDevice().BackendPath()
	for p, want := range map[string]string{
		fp + "/backend": bp, fp + "/backend-id": "0", fp + "/state": "1",
		bp + "/frontend": fp, bp + "/frontend-id": "5", bp + "/state": "1", bp + "/online": "1",
	} {
		if v, _ := s.get(p); v != want {
			t.Errorf("%s = %q, want %q", p, v, want)
		}
	}
	s.mu.Lock()
	fperm, bperm := s.perms[fp], s.perms[bp]
	s.mu.Unlock()
	if fperm != "n5,r0," || bperm != "n0,r5," {
		t.Errorf("permissions %q and %q", fperm, bperm)
	}
}

// handshake runs both ends to Connected and returns them.
func handshake(t *testing.T, front, back *Xenstore, refs []uint32) (*XenbusFront, *XenbusBack, XenRing) {
	t.Helper()
	ctx := testCtx(t)
	type backResult struct {
		b   *XenbusBack
		r   XenRing
		err error
	}
	done := make(chan backResult, 1)
	go func() {
		b, err := StartXenbusBack(ctx, back, testDevice())
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
	f, err := StartXenbusFront(ctx, front, testDevice().FrontDomid, testDevice().DevID)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version() != Version || f.MaxRingPages() != MaxRingPages || f.Device() != testDevice() {
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

func TestXenbusHandshake(t *testing.T) {
	for _, refs := range [][]uint32{{8}, {100, 101, 102, 103}, {9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 4294967295}} {
		t.Run(fmt.Sprint(len(refs), " pages"), func(t *testing.T) {
			s, front, back := newTestDevice(t)
			ctx := testCtx(t)
			f, b, r := handshake(t, front, back, refs)
			if !slices.Equal(r.Refs, refs) || r.Port != 33 || r.Version != Version {
				t.Fatalf("back end read %+v", r)
			}
			fp := testDevice().FrontendPath()
			if len(refs) > 1 {
				if v, _ := s.get(fp + "/ring-page-order"); v == "" {
					t.Fatal("no ring-page-order")
				}
			} else if v, _ := s.get(fp + "/ring-ref"); v != "8" {
				t.Fatalf("ring-ref %q", v)
			}
			if st, err := b.PeerState(ctx); err != nil || st != XenbusStateConnected {
				t.Fatalf("back sees the front %v, %v", st, err)
			}

			// The front end closes: it waits until the back end let go.
			closing := make(chan error, 1)
			go func() { closing <- f.Closing(ctx) }()
			if st, err := b.WaitPeerClosing(ctx); err != nil || st != XenbusStateClosing {
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
			for _, e := range s.stateLog() {
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
			if err := RemoveXenDevice(ctx, s.connect(t, 0), testDevice()); err != nil {
				t.Fatal(err)
			}
			if err := f.Closed(ctx); err != nil {
				t.Fatal("Closed after the device was removed:", err)
			}
			if err := switchState(ctx, front, fp, XenbusStateConnected, nil); !isNotExist(err) {
				t.Fatalf("switching a removed device: %v", err)
			}
			if _, there := s.get(fp + "/state"); there {
				t.Fatal("a removed device was recreated")
			}
		})
	}
}

// TestXenbusBackRefusesFront has a hostile front end write what it likes
// where the back end reads: every value is refused, with the key named.
func TestXenbusBackRefusesFront(t *testing.T) {
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
			b, err := StartXenbusBack(ctx, back, testDevice())
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range good {
				s.set(fp+"/"+k, v)
			}
			s.set(fp+"/"+tc.key, tc.val)
			_, err = b.WaitRing(ctx)
			if err == nil || !strings.Contains(err.Error(), "ring-ref") && !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("accepted, or no key named: %v", err)
			}
			t.Log(err)
		})
	}
}

func TestXenbusPeerChecks(t *testing.T) {
	fp, bp := testDevice().FrontendPath(), testDevice().BackendPath()
	for _, tc := range []struct {
		path, val string
		front     bool // the front end must refuse it, else the back end
	}{
		{fp + "/backend", "/local/domain/0/backend/vbd/5/0", true},
		{fp + "/backend-id", "32752", true},
		{fp + "/backend-id", "1", true}, // disagrees with backend
		{fp + "/backend-id", "00", true},
		{bp + "/frontend", "/local/domain/6/device/pvdrm/0", false},
		{bp + "/frontend-id", "6", false},
	} {
		t.Run(tc.path+"="+tc.val, func(t *testing.T) {
			s, front, back := newTestDevice(t)
			ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
			defer cancel()
			s.set(tc.path, tc.val)
			var err error
			if tc.front {
				_, err = StartXenbusFront(ctx, front, testDevice().FrontDomid, testDevice().DevID)
			} else {
				_, err = StartXenbusBack(ctx, back, testDevice())
			}
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("accepted: %v", err)
			}
			t.Log(err)
		})
	}
}

func TestXenbusPeerCloses(t *testing.T) {
	s, front, back := newTestDevice(t)
	ctx := testCtx(t)
	b, err := StartXenbusBack(ctx, back, testDevice())
	if err != nil {
		t.Fatal(err)
	}
	f, err := StartXenbusFront(ctx, front, testDevice().FrontDomid, testDevice().DevID)
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
	if err := f.WaitConnected(ctx); !errors.Is(err, ErrXenbusPeerClosed) {
		t.Fatalf("front end waiting for a closing back end: %v", err)
	}
	// A front end that closes while the back end waits for its ring.
	s.set(testDevice().FrontendPath()+"/state", "5")
	if _, err := b.WaitRing(ctx); !errors.Is(err, ErrXenbusPeerClosed) {
		t.Fatalf("back end waiting for a closing front end: %v", err)
	}
	if err := f.Publish(ctx, []uint32{8, 9, 10}, 1); err == nil {
		t.Fatal("three ring pages accepted")
	}
	if err := f.Publish(ctx, []uint32{8}, EvtchnPortMax+1); err == nil {
		t.Fatal("port out of range accepted")
	}
}

func TestXenbusWaitIsBounded(t *testing.T) {
	_, front, back := newTestDevice(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	// No back end runs: the front end waits for InitWait until ctx ends.
	if _, err := StartXenbusFront(ctx, front, testDevice().FrontDomid, testDevice().DevID); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// The connection ends while the back end waits.
	b, err := StartXenbusBack(testCtx(t), back, testDevice())
	if err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(10 * time.Millisecond); back.Close() }()
	if _, err := b.WaitRing(testCtx(t)); !errors.Is(err, ErrXenstoreClosed) {
		t.Fatalf("got %v", err)
	}
}

func TestSelfDomid(t *testing.T) {
	s := newTestXenstored()
	xs := s.connect(t, 5)
	ctx := testCtx(t)
	if _, err := SelfDomid(ctx, xs); !isNotExist(err) {
		t.Fatalf("no domid key: %v", err)
	}
	s.set("/local/domain/5/domid", "5")
	if id, err := SelfDomid(ctx, xs); err != nil || id != 5 {
		t.Fatalf("domid %d, %v", id, err)
	}
	s.set("/local/domain/5/domid", "65535")
	if _, err := SelfDomid(ctx, xs); err == nil {
		t.Fatal("reserved domid accepted")
	}
}

func TestXenbusStateString(t *testing.T) {
	if XenbusStateInitWait.String() != "InitWait" || XenbusState(9).String() != "XenbusState(9)" {
		t.Fatal("state names")
	}
}
