package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
)

// handoffConfig is a daemon of five 256 MiB slots on dir's sockets.
func handoffConfig(t *testing.T, dir, sock, ctl string) string {
	t.Helper()
	conf := dir + "/handoff.toml"
	if err := os.WriteFile(conf, []byte(`[board]
vram = "2GiB"
mem_partitions = 4
[daemon]
socket = "`+sock+`"
control_socket = "`+ctl+`"
max_vms = 5
[partition]
vram_per_vm = "256MiB"
reserved = "128MiB"
bar1_per_vm = "16MiB"
bar3_per_vm = "8MiB"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	return conf
}

// reshape replaces old with new in the configuration file conf.
func reshape(t *testing.T, conf, old, new string) {
	t.Helper()
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s has no %q", conf, old)
	}
	if err := os.WriteFile(conf, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// installGpuvm copies the gpuvm binary the tests run (this test binary,
// or $GPUVM_SELF_EXE) to path as an installer would: a new file renamed
// over the old, so a daemon running the old one keeps its image.
func installGpuvm(t *testing.T, path string, data []byte) {
	t.Helper()
	if data == nil {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		if p := os.Getenv(selfExeEnv); p != "" {
			exe = p
		}
		if data, err = os.ReadFile(exe); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path+".new", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// startInstalledDaemon starts `gpuvm serve --config conf` from the binary
// at exe and waits until its control socket answers.
func startInstalledDaemon(t *testing.T, exe, conf, ctl string) (*exec.Cmd, *lockedBuffer, chan error) {
	t.Helper()
	cmd := exec.Command(exe, "--log-level", "info", "serve", "--config", conf)
	cmd.Env = append(withoutEnv(os.Environ(), handoffEnv), reexecEnv+"=1")
	logs := &lockedBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		err := <-done
		done <- err
	})
	for i := 0; ; i++ {
		if _, _, err := runApp(t, "vgpu", "list", "--control-socket", ctl); err == nil {
			return cmd, logs, done
		}
		select {
		case err := <-done:
			t.Fatalf("daemon exited before serving: %v\n%s", err, logs)
		default:
		}
		if i > 1000 {
			t.Fatalf("daemon did not come up:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// loopVM is a VM process looping verified madd and cpy runs.
type loopVM struct {
	name        string
	pairs       int
	cmd         *exec.Cmd
	out         bytes.Buffer
	logs        lockedBuffer
	exited      chan error
	submissions uint64 // before the restart
}

// startLoopVM starts VM name (domain domid) on sock: pairs of madd and
// cpy, one verified run each. Its device model resumes after a saved Bye
// (the default) on the same socket.
func startLoopVM(t *testing.T, sock, name string, domid, pairs int) *loopVM {
	t.Helper()
	return startSizedLoopVM(t, sock, name, domid, pairs, "256KiB")
}

// startSizedLoopVM is startLoopVM with cpy moving copySize each way; extra
// are more devmodel flags (--mode).
func startSizedLoopVM(t *testing.T, sock, name string, domid, pairs int, copySize string, extra ...string) *loopVM {
	t.Helper()
	wl := strings.TrimSuffix(strings.Repeat("madd,cpy,", pairs), ",")
	vm := &loopVM{name: name, pairs: pairs, exited: make(chan error, 1)}
	vm.cmd = selfCommand(context.Background(), append([]string{"--log-level", "info", "devmodel", "--socket", sock,
		"--name", name, "--domid", strconv.Itoa(domid), "--ram", "64MiB", "--workloads", wl, "--runs", "1", "--no-warmup",
		"--matrix-dim", "32", "--copy-size", copySize, "--json"}, extra...))
	vm.cmd.Stdout, vm.cmd.Stderr = &vm.out, &vm.logs
	if err := vm.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { vm.exited <- vm.cmd.Wait() }()
	t.Cleanup(func() {
		vm.cmd.Process.Kill()
		err := <-vm.exited
		vm.exited <- err
	})
	return vm
}

// finish waits for vm to end and checks that every one of its runs
// verified; it returns the pause its device model reported, which it
// requires if resumed.
func (vm *loopVM) finish(t *testing.T, resumed bool) string {
	t.Helper()
	select {
	case err := <-vm.exited:
		vm.exited <- err
		if err != nil {
			t.Fatalf("VM %s failed: %v\n%s", vm.name, err, vm.logs.String())
		}
	case <-time.After(5 * time.Minute): // a hang guard only
		t.Fatalf("VM %s did not finish:\n%s", vm.name, vm.logs.String())
	}
	checkVerified(t, "VM "+vm.name, vm.out.Bytes(), 2*vm.pairs)
	m := regexp.MustCompile(`resumed on the restored vGPU.* pause=(\S+)`).FindStringSubmatch(vm.logs.String())
	if !resumed {
		if m != nil {
			t.Errorf("VM %s's device model resumed:\n%s", vm.name, vm.logs.String())
		}
		return ""
	}
	if m == nil {
		t.Errorf("VM %s's device model did not say it resumed:\n%s", vm.name, vm.logs.String())
		return ""
	}
	return m[1]
}

// markedVM is an honest VM whose device model is this test: it writes a
// marker page into the first and the last page of its VRAM through the
// PRAMIN window, and reads them back the same way.
type markedVM struct {
	dev    *devmodel.Device
	marker []byte
}

func connectMarkedVM(t *testing.T, sock, name string, domid uint32) *markedVM {
	t.Helper()
	dev, err := devmodel.Connect(context.Background(), devmodel.Config{Socket: sock, DomID: domid, Name: name, Mode: "fv-optimized",
		RAMSize: 64 << 20, ResumeTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	m := &markedVM{dev: dev, marker: make([]byte, nvc0.PageSize)}
	for i := range m.marker {
		m.marker[i] = byte(i*131+int(domid)*7) ^ 0xA5
	}
	return m
}

// pages are the marker's VRAM addresses: the first and the last page.
func (m *markedVM) pages() []uint64 {
	return []uint64{0, m.dev.Welcome().VRAMSize - nvc0.PageSize}
}

func (m *markedVM) window(addr uint64) uint64 {
	base := addr &^ (1<<nvc0.PRAMINWindowShift - 1)
	m.dev.Write32(0, nvc0.RegPRAMINWindow, nvc0.PRAMINWindowEncode(base))
	return nvc0.PRAMINBase + addr - base
}

func (m *markedVM) plant() {
	for _, p := range m.pages() {
		off := m.window(p)
		for i := 0; i < len(m.marker); i += 4 {
			m.dev.Write32(0, off+uint64(i), uint32(m.marker[i])|uint32(m.marker[i+1])<<8|uint32(m.marker[i+2])<<16|uint32(m.marker[i+3])<<24)
		}
	}
}

// check reports the first marker page that reads otherwise than planted.
func (m *markedVM) check() (uint64, bool) {
	for _, p := range m.pages() {
		off := m.window(p)
		got := make([]byte, len(m.marker))
		for i := 0; i < len(got); i += 4 {
			v := m.dev.Read32(0, off+uint64(i))
			got[i], got[i+1], got[i+2], got[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		if !bytes.Equal(got, m.marker) {
			return p, false
		}
	}
	return 0, true
}

// memoryHolds reports whether the memory of process pid that is mapped
// from a memfd (a VM process's guest RAM) holds b anywhere.
func memoryHolds(t *testing.T, pid int, b []byte) bool {
	t.Helper()
	maps, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	scanned := 0
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[5], "/memfd:") || !strings.HasPrefix(f[1], "r") {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("maps line %q", line)
		}
		data, err := io.ReadAll(io.NewSectionReader(mem, int64(start), int64(end-start)))
		if err != nil && len(data) == 0 {
			continue
		}
		scanned += len(data)
		if bytes.Contains(data, b) {
			return true
		}
	}
	if scanned == 0 {
		t.Fatalf("process %d: no memfd memory to scan", pid)
	}
	return false
}

// exeDeleted reports whether process pid runs a binary since removed or
// replaced on disk.
func exeDeleted(t *testing.T, pid int) bool {
	t.Helper()
	l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	return strings.HasSuffix(l, " (deleted)")
}

// usr2 sends the daemon the handoff's signal.
func usr2(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
}

// checkVerified fails t unless out, a VM's JSON results, holds want
// results, each verified. who names the VM in the messages.
func checkVerified(t *testing.T, who string, out []byte, want int) {
	t.Helper()
	var results []struct {
		Workload string `json:"workload"`
		Verified bool   `json:"verified"`
		Error    string `json:"error"`
	}
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatalf("%s's output is not JSON: %v\n%s", who, err, out)
	}
	if len(results) != want {
		t.Errorf("%s: %d results, want %d", who, len(results), want)
	}
	for i, r := range results {
		if !r.Verified {
			t.Errorf("%s: result %d (%s) did not verify: %s", who, i, r.Workload, r.Error)
		}
	}
}
