//go:build linux && (amd64 || arm64)

package xen

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNoDevices: without the devices every Open fails at once, saying so
// plainly.
func TestNoDevices(t *testing.T) {
	check := func(what string, err error, dev string) {
		t.Helper()
		if !errors.Is(err, ErrNoXen) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), dev) {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	dir := t.TempDir()
	_, err := OpenGntalloc(dir)
	check("gntalloc", err, filepath.Join(dir, "gntalloc"))
	_, err = OpenGntdev(dir)
	check("gntdev", err, filepath.Join(dir, "gntdev"))
	_, err = OpenEvtchn(dir)
	check("evtchn", err, filepath.Join(dir, "evtchn"))

	if _, err := os.Stat("/dev/xen/gntalloc"); err == nil {
		t.Log("this machine has /dev/xen: the default directory is not checked")
		return
	}
	_, err = OpenGntalloc("")
	check("gntalloc in /dev/xen", err, "/dev/xen/gntalloc")
}

func TestGrantCount(t *testing.T) {
	if checkGrantCount(0) == nil || checkGrantCount(MaxGrantPages+1) == nil || checkGrantCount(MaxGrantPages) != nil {
		t.Fatal("grant count bounds")
	}
}

// fakeDevDir makes regular files where the Xen devices belong: they open,
// and every ioctl on them fails (ENOTTY), as on a broken Xen.
func fakeDevDir(t *testing.T, names ...string) string {
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestGrantHelpersCheckFirst(t *testing.T) {
	dir := fakeDevDir(t, "gntdev", "gntalloc")
	d, err := OpenGntdev(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Map(5, []uint32{8, 1}, true); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("reserved reference: %v", err)
	}
	if _, err := d.Map(DomidFirstReserved, []uint32{8}, true); err == nil {
		t.Fatal("reserved domain accepted")
	}
	if _, err := d.Map(5, make([]uint32, MaxGrantPages+1), true); err == nil {
		t.Fatal("too many references accepted")
	}
	if _, err := d.Map(5, []uint32{8}, true); !errors.Is(err, unix.ENOTTY) || !strings.Contains(err.Error(), "map 1 grants of domain 5") {
		t.Fatalf("ioctl on a regular file: %v", err)
	}
	a, err := OpenGntalloc(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Share(0, 0, true); err == nil {
		t.Fatal("0 pages accepted")
	}
	if _, err := a.Share(DomidFirstReserved, 1, true); err == nil {
		t.Fatal("reserved domain accepted")
	}
	if _, err := a.Share(0, 1, true); !errors.Is(err, unix.ENOTTY) || !strings.Contains(err.Error(), "grant 1 pages to domain 0") {
		t.Fatalf("ioctl on a regular file: %v", err)
	}
	if a.Close() != nil || a.Close() != nil {
		t.Fatal("double close")
	}
}
