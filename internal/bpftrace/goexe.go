package bpftrace

import (
	"bytes"
	"debug/elf"
	"debug/gosym"
	"errors"
	"fmt"
)

// errNoPclntab says an executable has no Go function table.
var errNoPclntab = errors.New("no .gopclntab section (not a Go executable?)")

// goFuncOffsets finds Go functions in an executable by their full names
// (package path and name) and returns, for each one found, the file offset
// of its first instruction, which is where a uprobe goes. Of the functions
// of one name (an assembly function and the wrapper Go calls it through
// have the same) it takes the one whose code begins with marker; a name
// found but never with the marker is an error.
//
// It reads Go's own function table (.gopclntab), not the ELF symbol
// table: `go run` and `go test` link without the latter (-s), and so may a
// release build, but the runtime needs the former and no Go executable
// lacks it.
func goFuncOffsets(path string, names []string, marker []byte) (map[string]uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pcln := f.Section(".gopclntab")
	text := f.Section(".text")
	if pcln == nil || text == nil {
		return nil, errNoPclntab
	}
	data, err := pcln.Data()
	if err != nil {
		return nil, fmt.Errorf("reading .gopclntab: %w", err)
	}
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		return nil, fmt.Errorf("decoding .gopclntab: %w", err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]uint64{}
	seen := map[string]bool{}
	for _, fn := range tab.Funcs {
		if !want[fn.Name] {
			continue
		}
		seen[fn.Name] = true
		prog := execSegment(f, fn.Entry)
		if prog == nil {
			return nil, fmt.Errorf("%s at %#x is in no executable segment", fn.Name, fn.Entry)
		}
		code := make([]byte, len(marker))
		if _, err := prog.ReadAt(code, int64(fn.Entry-prog.Vaddr)); err != nil {
			return nil, fmt.Errorf("reading the code of %s: %w", fn.Name, err)
		}
		if bytes.Equal(code, marker) {
			out[fn.Name] = fn.Entry - prog.Vaddr + prog.Off
		}
	}
	for n := range seen {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("%s does not begin with the probe point's NOP (% x): a build from other sources?", n, marker)
		}
	}
	return out, nil
}

// execSegment is the executable segment that maps the code at addr.
func execSegment(f *elf.File, addr uint64) *elf.Prog {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && p.Vaddr <= addr && addr < p.Vaddr+p.Memsz {
			return p
		}
	}
	return nil
}
