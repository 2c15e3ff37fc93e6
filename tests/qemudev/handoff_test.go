package qemudev

import (
	"encoding/json"
	"fmt"
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

// daemon is a real `gpuvm serve` on a simulated board: its binary, sockets
// and log.
type daemon struct {
	exe, sock, ctl string
	cmd            *exec.Cmd
	logs           *syncBuffer
	exited         chan error
}

// startDaemon builds cmd/gpuvm and starts `gpuvm serve` with two 256 MiB
// slots (skipped without a QEMU with the device, and with -short).
func startDaemon(t *testing.T) *daemon {
	t.Helper()
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

	return &daemon{exe: exe, sock: sock, ctl: ctl, cmd: d, logs: logs, exited: exited}
}

// gpuvm runs the daemon's binary with args and returns its output.
func (d *daemon) gpuvm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(d.exe, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("gpuvm %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestHandoffUnderQEMU: a real `gpuvm serve` hands off (SIGUSR2) while
// QEMU's device, with posted writes, fills 64 KiB of its vGPU's VRAM
// through the PRAMIN window. The device resumes on the new process, the
// posted writes the old one had not run are repeated, and every word
// reads back what was written — before, during and after the handoff —
// from VRAM the board kept in place. The daemon keeps its PID.
func TestHandoffUnderQEMU(t *testing.T) {
	dm := startDaemon(t)
	sock, logs, d, exited := dm.sock, dm.logs, dm.cmd, dm.exited
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
	q.readsBack(t, words, word, 0x5a5a0000, "handoff")
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

// TestSaveRestoreUnderQEMU: QEMU's device, with posted writes, fills 64
// KiB of its vGPU's VRAM through the PRAMIN window; the vGPU is saved to
// a file with `gpuvm vgpu save` (destroyed once the image is on disk)
// and, while the device's next access waits, restored with `gpuvm vgpu
// restore --domid`. The device resumes on the restored vGPU and every
// word reads back, those written after the save included.
func TestSaveRestoreUnderQEMU(t *testing.T) {
	dm := startDaemon(t)
	q := startQEMU(t, qemuArgs(device(dm.sock, ",posted-writes=on"), true))
	q.place(t)
	q.writel(t, bar0Base+nvc0.RegPRAMINWindow, nvc0.PRAMINWindowEncode(16<<20))
	const words = 16384
	word := func(i int) uint64 { return bar0Base + nvc0.PRAMINBase + 4*uint64(i) }
	for i := range words / 2 {
		q.writel(t, word(i), uint32(i)^0x3c3c0000)
	}
	var list []struct {
		ID   int    `json:"id"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(dm.gpuvm(t, "vgpu", "list", "--control-socket", dm.ctl)), &list); err != nil || len(list) != 1 || list[0].Name != vmName {
		t.Fatalf("vgpu list: %+v, %v", list, err)
	}
	img := filepath.Join(t.TempDir(), "vgpu.img")
	dm.gpuvm(t, "vgpu", "save", "--control-socket", dm.ctl, fmt.Sprint(list[0].ID), img)
	restored := make(chan string, 1)
	go func() {
		time.Sleep(200 * time.Millisecond) // the device's next access waits meanwhile
		out, err := exec.Command(dm.exe, "vgpu", "restore", "--control-socket", dm.ctl, "--domid", fmt.Sprint(domID), img).CombinedOutput()
		if err != nil {
			out = append(out, []byte(err.Error())...)
		}
		restored <- string(out)
	}()
	for i := words / 2; i < words; i++ {
		q.writel(t, word(i), uint32(i)^0x3c3c0000)
	}
	t.Logf("restore: %s", strings.TrimSpace(<-restored))
	q.readsBack(t, words, word, 0x3c3c0000, "save and restore")
	for _, l := range strings.Split(q.stderr.String(), "\n") {
		if strings.Contains(l, "gpuvm:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// readsBack checks that the device resumed and that word i of the
// PRAMIN window reads i^mark for i < words.
func (q *qemu) readsBack(t *testing.T, words int, word func(int) uint64, mark uint32, after string) {
	t.Helper()
	bad := 0
	for i := range words {
		if v := q.readl(t, word(i)); v != uint32(i)^mark {
			if bad++; bad <= 5 {
				t.Errorf("word %d reads %#x, want %#x", i, v, uint32(i)^mark)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d words wrong after the %s", bad, words, after)
	}
	if s := q.stderr.String(); !strings.Contains(s, "gpuvm: resumed on the restored vGPU") {
		t.Fatalf("QEMU did not resume: %q", s)
	}
}
