package pvdrm

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

// cProbePrelude is the start of every probe program: P prints one
// "name value" line; SZ, FSZ and OFF print a struct's size and a field's
// size and offset.
const cProbePrelude = `#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#define P(name, v) printf("%s %lld\n", name, (long long)(v))
#define SZ(s) P("sizeof " #s, sizeof(struct s))
#define FSZ(s, f) P("sizeof " #s "." #f, sizeof(((struct s *)0)->f))
#define OFF(s, f) P("offsetof " #s "." #f, offsetof(struct s, f))
#define FIELD(s, f) do { FSZ(s, f); OFF(s, f); } while (0)
`

// cProbe compiles body (C statements inside main, after the prelude and
// the includes) with gcc, runs it and returns what it printed. It skips
// the test, saying what to install, if gcc or one of the headers (paths
// under /usr/include) is missing.
func cProbe(t *testing.T, pkg string, headers []string, defs, body string) map[string]int64 {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: install gcc to check the layouts against the C headers")
	}
	var src strings.Builder
	src.WriteString(cProbePrelude)
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
		v, err := strconv.ParseInt(line[i+1:], 10, 64)
		if i < 0 || err != nil {
			t.Fatalf("probe printed %q", line)
		}
		got[line[:i]] = v
	}
	return got
}

// compareProbe fails the test for every name whose C and Go values differ,
// and for every name only one side has.
func compareProbe(t *testing.T, c map[string]int64, goSide map[string]int64) {
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
