// Package cprobe checks a Go package's idea of a C ABI against C itself:
// Run compiles a small C program against the system's headers with gcc,
// runs it and returns the names and values it printed; Layout collects the
// Go side under the same names, and Compare fails the test for every
// difference. It is for tests of the packages that mirror kernel or Xen
// headers (xen, xen/xenstore, xen/xenbus). Without gcc or a header, Run
// skips the test and says what to install.
package cprobe

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Prelude is the start of every probe program: P prints one "name value"
// line; SZ, FSZ and OFF print a struct's size and a field's size and
// offset, and FIELD a field's size and offset, under the names Layout
// uses.
const Prelude = `#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#define P(name, v) printf("%s %lld\n", name, (long long)(v))
#define SZ(s) P("sizeof " #s, sizeof(struct s))
#define FSZ(s, f) P("sizeof " #s "." #f, sizeof(((struct s *)0)->f))
#define OFF(s, f) P("offsetof " #s "." #f, offsetof(struct s, f))
#define FIELD(s, f) do { FSZ(s, f); OFF(s, f); } while (0)
`

// Run compiles body (C statements inside main) after the Prelude, defs and
// an #include of each of headers (paths under /usr/include) with gcc, runs
// it and returns what it printed. It skips the test, saying what to
// install (pkg names the Debian package of the headers), if gcc or one of
// the headers is missing.
func Run(t testing.TB, pkg string, headers []string, defs, body string) map[string]int64 {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: install gcc to check the layouts against the C headers")
	}
	var src strings.Builder
	src.WriteString(Prelude)
	src.WriteString(defs)
	for _, h := range headers {
		if _, err := os.Stat(filepath.Join("/usr/include", h)); err != nil {
			t.Skipf("header <%s> not found: install the Debian package %s to check the layouts against it", h, pkg)
		}
		src.WriteString("#include <" + h + ">\n")
	}
	src.WriteString("int main(void) {\n" + body + "\nreturn 0;\n}\n")
	dir := t.TempDir()
	cfile, bin := filepath.Join(dir, "probe.c"), filepath.Join(dir, "probe")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-Wall", "-Werror", "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s\n--- probe.c\n%s", err, out, src.String())
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	got := make(map[string]int64)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("probe printed %q", line)
		}
		v, err := strconv.ParseInt(line[i+1:], 10, 64)
		if err != nil {
			t.Fatalf("probe printed %q", line)
		}
		got[line[:i]] = v
	}
	return got
}

// Layout collects the Go side of a comparison under the names the probe
// prints: "sizeof s", "sizeof s.f", "offsetof s.f", or a constant's name.
type Layout map[string]int64

// Size records the size of struct s.
func (g Layout) Size(s string, n uintptr) { g["sizeof "+s] = int64(n) }

// Field records the size and offset of field f of struct s, as FIELD
// prints them.
func (g Layout) Field(s, f string, n, off uintptr) {
	g["sizeof "+s+"."+f], g["offsetof "+s+"."+f] = int64(n), int64(off)
}

// Compare fails the test for every name whose C and Go values differ, for
// every name only one side has, and if the probe printed nothing.
func Compare(t testing.TB, c, goSide map[string]int64) {
	t.Helper()
	var names []string
	for n := range c {
		names = append(names, n)
	}
	for n := range goSide {
		if _, ok := c[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		cv, inC := c[n]
		gv, inGo := goSide[n]
		switch {
		case !inC:
			t.Errorf("%s: checked on the Go side but not printed by the C probe", n)
		case !inGo:
			t.Errorf("%s: printed by the C probe (%d) but has no Go counterpart", n, cv)
		case cv != gv:
			t.Errorf("%s: C %d (%#x), Go %d (%#x)", n, cv, cv, gv, gv)
		}
	}
	if len(c) == 0 {
		t.Error("the C probe printed nothing")
	}
}
