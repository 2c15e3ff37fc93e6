package qemudev

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"golang.org/x/sys/unix"
)

// TestHandoffUnderQEMU: a real `gpuvm serve` hands off (SIGUSR2) while
// QEMU's device, with posted writes, fills 64 KiB of its vGPU's VRAM
// through the PRAMIN window. The device resumes on the new process, the
// posted writes the old one had not run are repeated, and every word
// reads back what was written — before, during and after the handoff —
// from VRAM the board kept in place. The daemon keeps its PID.
func TestHandoffUnderQEMU(t *testing.T) {
	qemuBinary(t) // skips without a QEMU with the device
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "gpuvm")
	build := exec.Command("go", "build", "-o", exe, "github.com/gpuvm/gpuvm/cmd/gpuvm")
	build.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gpuvm: %v\n%s", err, out)
	}
	sock, ctl, conf := filepath.Join(dir, "gpuvm.sock"), filepath.Join(dir, "ctl.sock"), filepath.Join(dir, "gpuvm.toml")
	if err := os.WriteFile(conf, []byte(`[board]
vram = "1GiB"
mem_partitions = 4
[daemon]
socket = "`+sock+`"
control_socket = "`+ctl+`"
max_vms = 2
[partition]
vram_per_vm = "256MiB"
reserved = "128MiB"
bar1_per_vm = "16MiB"
bar3_per_vm = "16MiB"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	d := exec.Command(exe, "--log-level", "info", "serve", "--config", conf)
	logs := &syncBuffer{}
	d.Stderr = logs
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	t.Cleanup(func() {
		d.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", logs)
		}
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("unix", ctl); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not serve:\n%s", logs)
		}
	}

	q := startQEMU(t, qemuArgs(device(sock, ",posted-writes=on"), true))
	q.place(t)
	if v := q.readl(t, bar0Base); v != nvc0.Boot0Value {
		t.Fatalf("PMC_BOOT_0 reads %#x", v)
	}
	q.writel(t, bar0Base+nvc0.RegPRAMINWindow, nvc0.PRAMINWindowEncode(16<<20))
	const words = 16384
	word := func(i int) uint64 { return bar0Base + nvc0.PRAMINBase + 4*uint64(i) }
	for i := range words / 4 {
		q.writel(t, word(i), uint32(i)^0x5a5a0000)
	}
	if err := d.Process.Signal(unix.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	for i := words / 4; i < words; i++ { // into and across the handoff
		q.writel(t, word(i), uint32(i)^0x5a5a0000)
	}
	for deadline := time.Now().Add(time.Minute); !strings.Contains(logs.String(), "serving on the sockets the previous process handed over"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) || strings.Contains(logs.String(), "handoff failed") {
			t.Fatal("no new process serves")
		}
	}
	bad := 0
	for i := range words {
		if v := q.readl(t, word(i)); v != uint32(i)^0x5a5a0000 {
			if bad++; bad <= 5 {
				t.Errorf("word %d reads %#x, want %#x", i, v, uint32(i)^0x5a5a0000)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d words wrong after the handoff", bad, words)
	}
	if s := q.stderr.String(); !strings.Contains(s, "gpuvm: resumed on the restored vGPU") {
		t.Fatalf("QEMU did not resume: %q", s)
	}
	select {
	case err := <-exited:
		exited <- err
		t.Fatalf("the daemon exited: %v", err)
	default:
	}
	for _, l := range strings.Split(q.stderr.String(), "\n") {
		if strings.Contains(l, "gpuvm:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}
