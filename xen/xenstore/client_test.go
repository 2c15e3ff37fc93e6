package xenstore_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/xen/xenstore"
	"github.com/gpuvm/gpuvm/xen/xenstore/xenstoretest"
	"golang.org/x/sys/unix"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestClient(t *testing.T) {
	ctx := testCtx(t)
	s := xenstoretest.NewServer()
	xs := s.Connect(t, 5)
	if err := xs.Write(ctx, "/local/domain/5/a/b", "v1"); err != nil {
		t.Fatal(err)
	}
	if v, err := xs.Read(ctx, "a/b"); err != nil || v != "v1" { // relative to the domain's home
		t.Fatalf("read: %q %v", v, err)
	}
	if err := xs.Mkdir(ctx, "/local/domain/5/a/c"); err != nil {
		t.Fatal(err)
	}
	if kids, err := xs.Directory(ctx, "/local/domain/5/a"); err != nil || strings.Join(kids, ",") != "b,c" {
		t.Fatalf("directory: %q %v", kids, err)
	}
	if err := xs.SetPerms(ctx, "/local/domain/5/a", xenstore.Perm{Domid: 5, Access: 'n'}, xenstore.Perm{Domid: 0, Access: 'r'}); err != nil {
		t.Fatal(err)
	}
	if got := s.Perms("/local/domain/5/a"); strings.Join(got, ",") != "n5,r0" {
		t.Fatalf("permissions %q", got)
	}
	if p, err := xs.GetDomainPath(ctx, 5); err != nil || p != "/local/domain/5" {
		t.Fatalf("domain path: %q %v", p, err)
	}
	if err := xs.Rm(ctx, "/local/domain/5/a"); err != nil {
		t.Fatal(err)
	}
	_, err := xs.Read(ctx, "/local/domain/5/a/b")
	var xe *xenstore.Error
	if !errors.As(err, &xe) || xe.Errno != "ENOENT" || xe.Op != "XS_READ" || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read of a removed node: %v", err)
	}
	if err := xs.Write(ctx, "/bad path", "x"); err == nil {
		t.Fatal("bad path sent")
	}
	if err := xs.Write(ctx, "/big", strings.Repeat("x", xenstore.PayloadMax)); err == nil {
		t.Fatal("oversized write sent")
	}
	if xs.Close() != nil || xs.Err() == nil {
		t.Fatal("close")
	}
	if _, err := xs.Read(ctx, "/x"); !errors.Is(err, xenstore.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
}

func TestWatch(t *testing.T) {
	ctx := testCtx(t)
	s := xenstoretest.NewServer()
	xs, other := s.Connect(t, 0), s.Connect(t, 0)
	w, err := xs.Watch(ctx, "/dev/x")
	if err != nil {
		t.Fatal(err)
	}
	next := func() string {
		select {
		case p := <-w.Events():
			return p
		case <-ctx.Done():
			t.Fatal("no watch event")
			return ""
		}
	}
	if p := next(); p != "/dev/x" {
		t.Fatalf("initial event %q", p)
	}
	if err := other.Write(ctx, "/dev/x/state", "4"); err != nil {
		t.Fatal(err)
	}
	if p := next(); p != "/dev/x/state" {
		t.Fatalf("event %q", p)
	}
	if err := other.Write(ctx, "/dev/y", "1"); err != nil { // not watched
		t.Fatal(err)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, open := <-w.Events(); open {
		t.Fatal("an event outside the watched path, or the channel open after Stop")
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal("second stop:", err)
	}
	// A watch ends when the connection does.
	w2, err := xs.Watch(ctx, "/dev")
	if err != nil {
		t.Fatal(err)
	}
	xs.Close()
	for range w2.Events() {
	}
}

func TestTransaction(t *testing.T) {
	ctx := testCtx(t)
	s := xenstoretest.NewServer()
	xs := s.Connect(t, 0)
	s.FailCommits(2)
	runs := 0
	err := xs.Transaction(ctx, func(tx xenstore.Tx) error {
		runs++
		return tx.Write(ctx, "/t/a", "1")
	})
	if err != nil || runs != 3 {
		t.Fatalf("transaction: %v after %d runs", err, runs)
	}
	if v, _ := s.Get("/t/a"); v != "1" {
		t.Fatal("commit not applied")
	}
	boom := errors.New("boom")
	err = xs.Transaction(ctx, func(tx xenstore.Tx) error {
		if err := tx.Write(ctx, "/t/b", "1"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, there := s.Get("/t/b"); there {
		t.Fatal("an abandoned transaction was applied")
	}
	cctx, cancel := context.WithCancel(ctx)
	err = xs.Transaction(cctx, func(tx xenstore.Tx) error {
		cancel()
		return tx.Write(ctx, "/t/c", "1")
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled transaction: %v", err)
	}
	open := s.OpenTransactions()
	if _, there := s.Get("/t/c"); there || open != 0 {
		t.Fatalf("a cancelled transaction was applied, or left open (%d)", open)
	}
	s.FailCommits(xenstore.TransactionRetries)
	if err := xs.Transaction(ctx, func(xenstore.Tx) error { return nil }); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("endless conflicts: %v", err)
	}
}

func TestOpenWithoutXen(t *testing.T) {
	for _, p := range []string{xenstore.SocketPath, xenstore.DevPath} {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("%s exists here", p)
		}
	}
	_, err := xenstore.Open()
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), xenstore.DevPath) || !strings.Contains(err.Error(), xenstore.SocketPath) {
		t.Fatalf("got %v", err)
	}
	t.Log(err)
}
