package bpftrace

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readSum reads bpf.sum, what gen-bpf.sh recorded.
func readSum(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("bpf.sum")
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && !strings.HasPrefix(k, "#") {
			sum[k] = v
		}
	}
	return sum
}

func sha(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// TestObjectUpToDate checks the checked-in BPF object against its source:
// always that it was built from the source as it is (bpf.sum) and is the
// object embedded; with the clang that built it, that compiling the source
// again gives the same bytes.
func TestObjectUpToDate(t *testing.T) {
	sum := readSum(t)
	src, err := os.ReadFile("gpuvm_trace.bpf.c")
	if err != nil {
		t.Fatal(err)
	}
	if sha(src) != sum["source"] {
		t.Fatal("gpuvm_trace.bpf.c changed since gpuvm_trace.bpf.o was built: run go generate ./internal/bpftrace and commit the object")
	}
	if sha(object) != sum["object"] {
		t.Fatal("the embedded gpuvm_trace.bpf.o is not the one gen-bpf.sh built (bpf.sum): run go generate ./internal/bpftrace")
	}
	clang, strip := os.Getenv("CLANG"), os.Getenv("LLVM_STRIP")
	if clang == "" {
		clang = "clang"
	}
	if strip == "" {
		strip = "llvm-strip"
	}
	for _, tool := range []string{clang, strip} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("not rebuilding the object: no %s (Debian: apt-get install clang llvm libbpf-dev); the source hash matched", tool)
		}
	}
	out, err := exec.Command(clang, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version, _, _ := strings.Cut(string(out), "\n")
	if version != sum["clang"] {
		t.Skipf("not rebuilding the object: %q is not the clang that built it (%q), whose output may differ; the source hash matched", version, sum["clang"])
	}
	dir := t.TempDir()
	if out, err := exec.Command("sh", "gen-bpf.sh", dir).CombinedOutput(); err != nil {
		t.Skipf("gen-bpf.sh cannot build here (headers missing? Debian: libbpf-dev linux-libc-dev): %v\n%s", err, out)
	}
	rebuilt, err := os.ReadFile(filepath.Join(dir, "gpuvm_trace.bpf.o"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rebuilt, object) {
		t.Fatal("compiling gpuvm_trace.bpf.c again gives another object: run go generate ./internal/bpftrace and commit it")
	}
}
