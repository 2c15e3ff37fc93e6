package pvdrm

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestPVDRMDoc: docs/pvdrm.md §3 has a row per operation with exactly the
// fields Specs() defines.
func TestPVDRMDoc(t *testing.T) {
	b, err := os.ReadFile("../docs/pvdrm.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	fields := func(fs []Field) string {
		var out []string
		for _, f := range fs {
			out = append(out, fmt.Sprintf("%s u%d @%d", f.Name, 8*f.Size, f.Off))
		}
		if len(out) == 0 {
			return "—"
		}
		return strings.Join(out, "; ")
	}
	for _, s := range Specs() {
		file := "no"
		if s.File {
			file = "yes"
		}
		row := fmt.Sprintf("| %d | %s | %s | %s | %s |", s.Op, s.Name, file, fields(s.Args), fields(s.Results))
		if !strings.Contains(doc, row) {
			t.Errorf("docs/pvdrm.md lacks the row\n%s", row)
		}
	}
	for _, want := range []string{fmt.Sprintf("| 64 | entries |"), fmt.Sprintf("0x10 args[%d]", ArgsSize)} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/pvdrm.md lacks %q", want)
		}
	}
}
