package hypercall

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestProtocolDoc: docs/protocol.md §12 lists every operation with its
// number, name and argument size as Specs() defines them, and every result
// code.
func TestProtocolDoc(t *testing.T) {
	b, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "## 12.")
	if i < 0 {
		t.Fatal("docs/protocol.md has no §12")
	}
	doc = doc[i:]
	for _, s := range Specs() {
		size := fmt.Sprint(s.Fixed)
		switch {
		case s.Op == OpMulticall:
			size = fmt.Sprintf("≤ %d", MaxArgs)
		case s.Elem > 0:
			size = fmt.Sprintf("%d + %d·count", s.Fixed, s.Elem)
		}
		row := fmt.Sprintf("| %d | %s | %s |", s.Op, s.Name, size)
		if !strings.Contains(doc, row) {
			t.Errorf("§12.3 lacks the row %q", row)
		}
		for _, f := range s.Fields {
			if f.Name == "reserved" {
				continue
			}
			if !strings.Contains(doc, fmt.Sprintf("%s u%d @%d", f.Name, 8*f.Size, f.Off)) {
				t.Errorf("§12.3 %s: field %s u%d @%d not documented", s.Name, f.Name, 8*f.Size, f.Off)
			}
		}
	}
	for c := OK; c <= ErrFailed; c++ {
		name := "OK"
		for n, v := range map[string]Code{"ErrInval": ErrInval, "ErrNoSys": ErrNoSys, "ErrRange": ErrRange, "ErrFault": ErrFault,
			"ErrHandle": ErrHandle, "ErrNoMem": ErrNoMem, "ErrBusy": ErrBusy, "ErrSlot": ErrSlot, "ErrFailed": ErrFailed} {
			if v == c {
				name = n
			}
		}
		if !strings.Contains(doc, fmt.Sprintf("| %d | %s |", c, name)) {
			t.Errorf("§12.4 lacks code %d %s", c, name)
		}
	}
	for _, reg := range []struct {
		off  int
		name string
	}{{RegID, "RegID"}, {RegSlot, "RegSlot"}, {RegSlotLo, "RegSlotLo"}, {RegSlotHi, "RegSlotHi"},
		{RegStatus, "RegStatus"}, {RegCall, "RegCall"}, {RegResult, "RegResult"}, {RegCalls, "RegCalls"}} {
		if !strings.Contains(doc, fmt.Sprintf("| %#02x | `%s` |", reg.off, reg.name)) && !strings.Contains(doc, fmt.Sprintf("| 0x%02X | `%s` |", reg.off, reg.name)) {
			t.Errorf("§12.1 lacks register %s at %#x", reg.name, reg.off)
		}
	}
}
