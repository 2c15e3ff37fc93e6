package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// daemonConfig is a small daemon configuration on dir's sockets.
func daemonConfig(t *testing.T, dir, sock, ctl, extra string) string {
	t.Helper()
	conf := dir + "/" + strings.TrimSuffix(strings.TrimPrefix(sock, dir+"/"), ".sock") + ".toml"
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
bar1_per_vm = "32MiB"
bar3_per_vm = "8MiB"
`+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	return conf
}

// daemon is a `gpuvm serve` process.
type daemon struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

// startDaemon starts `gpuvm serve --config conf` and waits until its
// control socket answers (or it exits).
func startDaemon(t *testing.T, conf, ctl string, flags ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: selfCommand(context.Background(), append([]string{"serve", "--config", conf}, flags...)), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
	})
	for i := 0; ; i++ {
		if _, _, err := runApp(t, "vgpu", "list", "--control-socket", ctl); err == nil {
			return d
		}
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("daemon exited before serving: %v\n%s", err, d.stderr)
		default:
		}
		if i > 500 {
			t.Fatalf("daemon did not come up:\n%s", d.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-d.done; err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v\n%s", err, d.stderr)
	}
	d.done <- nil
}

// TestSecondDaemonSameControlSocket: a second `gpuvm serve` with its own
// device socket but the first one's control socket is refused, and the
// first daemon's control socket survives it (it used to be deleted).
func TestSecondDaemonSameControlSocket(t *testing.T) {
	dir := t.TempDir()
	ctl := dir + "/ctl.sock"
	first := startDaemon(t, daemonConfig(t, dir, dir+"/a.sock", ctl, ""), ctl)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	second := selfCommand(ctx, []string{"serve", "--config", daemonConfig(t, dir, dir+"/b.sock", ctl, "")})
	out, err := second.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the second daemon is serving on the first one's control socket:\n%s", out)
	}
	if err == nil {
		t.Fatalf("the second daemon exited 0:\n%s", out)
	}
	if !strings.Contains(string(out), "another server is listening there") {
		t.Errorf("the second daemon's error does not say why:\n%s", out)
	}
	if _, err := os.Stat(dir + "/b.sock"); !os.IsNotExist(err) {
		t.Errorf("the refused daemon left its device socket behind: %v", err)
	}
	if _, _, err := runApp(t, "vgpu", "list", "--control-socket", ctl); err != nil {
		t.Fatalf("the first daemon's control socket is gone after the second daemon: %v", err)
	}
	if _, err := os.Stat(dir + "/a.sock"); err != nil {
		t.Errorf("the first daemon's device socket: %v", err)
	}
	first.stop(t)
	if _, err := os.Stat(ctl); !os.IsNotExist(err) {
		t.Errorf("control socket left after a clean shutdown: %v", err)
	}
}

// TestSocketDir: the daemon creates its socket directory private, and
// refuses one where another user could replace its sockets.
func TestSocketDir(t *testing.T) {
	dir := t.TempDir()
	d := dir + "/run/gpuvm"
	if err := socketDir(d); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("created %v, %v; want mode 0700", fi.Mode(), err)
	}
	open := dir + "/open"
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	if err := socketDir(open); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("world-writable directory: %v", err)
	}
	os.Chmod(open, 0o777|os.ModeSticky)
	if err := socketDir(open); err != nil {
		t.Errorf("sticky world-writable directory (like /tmp): %v", err)
	}
	link := dir + "/link"
	os.Symlink(d, link)
	if err := socketDir(link); err == nil {
		t.Error("a symbolic link was accepted as the socket directory")
	}
	if os.Geteuid() == 0 {
		other := dir + "/other"
		os.Mkdir(other, 0o700)
		os.Chown(other, 4242, 4242)
		if err := socketDir(other); err == nil || !strings.Contains(err.Error(), "owned by uid 4242") {
			t.Errorf("directory of another user: %v", err)
		}
	}
}

// TestDevmodelHeader: a VM process's table names the vGPU it got (VRAM,
// channels, the board's timing profile), and its progress line counts
// runs in English.
func TestDevmodelHeader(t *testing.T) {
	dir := t.TempDir()
	ctl := dir + "/ctl.sock"
	startDaemon(t, daemonConfig(t, dir, dir+"/a.sock", ctl, "[[vm]]\nname = \"g\"\nchannels = 5\n"), ctl)
	vm := selfCommand(context.Background(), []string{"devmodel", "--socket", dir + "/a.sock", "--name", "g", "--domid", "3",
		"--ram", "64MiB", "--workloads", "nop", "--runs", "1"})
	var stderr bytes.Buffer
	vm.Stderr = &stderr
	out, err := vm.Output()
	if err != nil {
		t.Fatalf("devmodel: %v\n%s%s", err, out, stderr.String())
	}
	if want := "board: virtual GPU (vgpu fv-optimized), 256 MiB VRAM, 5 channels, timing none\n"; !strings.HasPrefix(string(out), want) {
		t.Errorf("header:\n%s\nwant it to start with %q", out, want)
	}
	if want := "(1 warm-up run + 1 measured run)"; !strings.Contains(stderr.String(), want) {
		t.Errorf("progress %q lacks %q", stderr.String(), want)
	}
}

// waitComputing waits until the VM called name has had a submission
// complete on its vGPU (its driver's set-up — page tables, instance
// blocks, the inputs — takes seconds of trapped writes on a loaded
// machine before the first kernel).
func waitComputing(t *testing.T, ctl, name string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var vgpus []aggregator.VGPUInfo
		err := controlGet(context.Background(), ctl, "/v1/vgpus", &vgpus)
		for _, v := range vgpus {
			if v.Name == name && v.Sched.Submissions > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("VM %s never computed: %v %+v", name, err, vgpus)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startComputingVM starts a VM process that computes (a madd fairness
// load) on the daemon at sock until the test ends, and waits until it has
// computed (waitComputing). The test may kill it earlier.
func startComputingVM(t *testing.T, sock, ctl, name string, domid int) *exec.Cmd {
	t.Helper()
	vm := selfCommand(context.Background(), []string{"devmodel", "--socket", sock, "--name", name, "--domid", strconv.Itoa(domid),
		"--ram", "128MiB", "--fairness", "madd", "--matrix-dim", "64", "--duration", "10m"})
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { vm.Wait(); close(done) }()
	t.Cleanup(func() { vm.Process.Kill(); <-done })
	waitComputing(t, ctl, name)
	return vm
}
