package pvdrm

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// passFiles sends files across a Unix socket pair (SCM_RIGHTS), as a front
// end process sends them to the back end, and returns the received ones.
func passFiles(t *testing.T, files []*os.File) []*os.File {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[0])
	defer unix.Close(sp[1])
	var fds []int
	for _, f := range files {
		fds = append(fds, int(f.Fd()))
	}
	if err := unix.Sendmsg(sp[0], []byte{0}, unix.UnixRights(fds...), nil, 0); err != nil {
		t.Fatal(err)
	}
	oob := make([]byte, unix.CmsgSpace(4*len(fds)))
	_, oobn, _, _, err := unix.Recvmsg(sp[1], make([]byte, 1), oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	got, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	var out []*os.File
	for _, fd := range got {
		out = append(out, os.NewFile(uintptr(fd), "received"))
	}
	return out
}

func TestLocalTransport(t *testing.T) {
	front, err := NewLocalFront(1)
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	back, err := AttachLocalBack(passFiles(t, front.Files()))
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	fr, err := NewFront(front.Ring())
	if err != nil {
		t.Fatal(err)
	}
	br, err := NewBack(back.Ring())
	if err != nil {
		t.Fatal(err)
	}
	if fr.Size() != 16 || br.Size() != 16 {
		t.Fatalf("a one-page ring holds %d/%d slots, want 16", fr.Size(), br.Size())
	}
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { // the back end: answer 100 requests, sleeping on its eventfd
		got := make([]byte, SlotSize)
		for served := 0; served < 100; {
			ok, err := br.Next(got)
			if err != nil {
				done <- err
				return
			}
			if !ok {
				if !br.FinalCheck() {
					if err := back.Wait(ctx, time.Second); err != nil {
						done <- err
						return
					}
				}
				continue
			}
			got[16]++
			if br.Respond(got) {
				back.Notify()
			}
			served++
		}
		done <- nil
	}()
	rsp := make([]byte, SlotSize)
	for i := range 100 {
		r := req(byte(i))
		if kick, err := fr.Push(r); err != nil {
			t.Fatal(err)
		} else if kick {
			front.Notify()
		}
		for {
			ok, err := fr.Poll(rsp)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			if !fr.FinalCheck() {
				front.Wait(ctx, time.Second)
			}
		}
		if rsp[0] != byte(i) || rsp[16] != byte(i)+1 {
			t.Fatalf("request %d answered with %d/%d", i, rsp[0], rsp[16])
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The back end refuses what a hostile front end might send instead of a
// sealed memfd and two eventfds.
func TestLocalAttachRefuses(t *testing.T) {
	good, err := NewLocalFront(1)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	tmp, err := os.CreateTemp(t.TempDir(), "ring")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Truncate(4096)
	unsealed, _ := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	unix.Ftruncate(unsealed, 4096)
	big, err := NewLocalFront(MaxRingPages)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	pipe := os.NewFile(uintptr(p[0]), "pipe")
	defer os.NewFile(uintptr(p[1]), "pipe").Close()
	f := good.Files()
	for _, tc := range []struct {
		what  string
		files []*os.File
		want  string
	}{
		{"two files", f[:2], "want 3 files"},
		{"a regular file as the ring", []*os.File{tmp, f[1], f[2]}, "not a memfd"},
		{"an unsealed memfd", []*os.File{os.NewFile(uintptr(unsealed), "memfd"), f[1], f[2]}, "F_SEAL_SHRINK"},
		{"a pipe as the notification", []*os.File{f[0], pipe, f[2]}, "not an eventfd"},
	} {
		_, err := AttachLocalBack(passFiles(t, tc.files))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.what, err, tc.want)
		}
	}
	if l, err := AttachLocalBack(passFiles(t, big.Files())); err != nil {
		t.Errorf("the largest ring refused: %v", err)
	} else {
		l.Close()
	}
}
