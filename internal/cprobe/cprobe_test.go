package cprobe

import (
	"fmt"
	"testing"
	"unsafe"
)

func TestRun(t *testing.T) {
	c := Run(t, "libc6-dev", []string{"stdint.h"},
		"struct probe_pair { uint32_t a; uint64_t b; uint16_t c; };\n", `
	SZ(probe_pair);
	FIELD(probe_pair, a); FIELD(probe_pair, b); FIELD(probe_pair, c);
	P("ANSWER", 42);`)
	var p struct {
		A uint32
		B uint64
		C uint16
	}
	g := Layout{"ANSWER": 42}
	g.Size("probe_pair", unsafe.Sizeof(p))
	g.Field("probe_pair", "a", unsafe.Sizeof(p.A), unsafe.Offsetof(p.A))
	g.Field("probe_pair", "b", unsafe.Sizeof(p.B), unsafe.Offsetof(p.B))
	g.Field("probe_pair", "c", unsafe.Sizeof(p.C), unsafe.Offsetof(p.C))
	Compare(t, c, g)
}

// recorder keeps the errors Compare reports instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Error(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }

func TestCompareReports(t *testing.T) {
	r := &recorder{TB: t}
	Compare(r, map[string]int64{"same": 1, "differs": 2, "only C": 3}, map[string]int64{"same": 1, "differs": 4, "only Go": 5})
	if len(r.errs) != 3 {
		t.Fatalf("want 3 differences, got %q", r.errs)
	}
	r.errs = nil
	Compare(r, nil, nil)
	if len(r.errs) != 1 {
		t.Fatalf("an empty probe: %q", r.errs)
	}
}
