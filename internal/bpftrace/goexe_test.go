package bpftrace

import (
	"os"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/internal/probe"
)

// The probe points are found in this test binary (linked without an ELF
// symbol table, as `go test` links) by their Go names, at their NOP.
func TestGoFuncOffsets(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	names := []string{probe.SymTrapBegin, probe.SymTrapEnd, probe.SymRelease, "no/such.Function"}
	offs, err := goFuncOffsets(exe, names, []byte(probe.Marker))
	if err != nil {
		t.Fatal(err)
	}
	if len(offs) != 3 {
		t.Fatalf("found %v, want the 3 probe points", offs)
	}
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, off := range offs {
		code := make([]byte, 6)
		if _, err := f.ReadAt(code, int64(off)); err != nil {
			t.Fatal(err)
		}
		if string(code[:5]) != probe.Marker || code[5] != 0xc3 {
			t.Errorf("%s at file offset %#x: % x, want the NOP and RET", name, off, code)
		}
	}
	// A function that does not begin with the NOP is refused.
	if _, err := goFuncOffsets(exe, []string{"github.com/gpuvm/gpuvm/internal/bpftrace.goFuncOffsets"}, []byte(probe.Marker)); err == nil || !strings.Contains(err.Error(), "does not begin with") {
		t.Errorf("goFuncOffsets: %v", err)
	}
	if _, err := goFuncOffsets("/bin/sh", names, []byte(probe.Marker)); err != errNoPclntab {
		t.Errorf("/bin/sh: %v, want %v", err, errNoPclntab)
	}
}
