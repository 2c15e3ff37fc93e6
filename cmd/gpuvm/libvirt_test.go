package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/gpuvm/gpuvm/internal/vgpumeta"
)

// lockedBuffer is a bytes.Buffer a process writes and a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// vgpuInfo is what the tests read of GET /v1/vgpus.
type vgpuInfo struct {
	ID        int    `json:"id"`
	DomID     uint32 `json:"domid"`
	Name      string `json:"name"`
	Mode      string `json:"mode"`
	Profile   string `json:"profile"`
	PID       int    `json:"devmodel_pid"`
	VRAMBytes uint64 `json:"vram_bytes"`
}

// listVGPUs is GET /v1/vgpus, by domain name.
func listVGPUs(t *testing.T, ctl string) map[string]vgpuInfo {
	t.Helper()
	var list []vgpuInfo
	if err := controlGet(context.Background(), ctl, "/v1/vgpus", &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]vgpuInfo{}
	for _, v := range list {
		out[v.Name] = v
	}
	return out
}

// waitFor polls cond until it holds; after timeout it fails, saying what
// it waited for and what the processes said.
func waitFor(t *testing.T, what string, timeout time.Duration, logs func() string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(timeout); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("waited %v for %s; logs:\n%s", timeout, what, logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDevmodelHold: devmodel --hold keeps its vGPU after its workloads
// until SIGTERM (then exits 0, and the vGPU is gone), and exits 1 if the
// aggregator takes the vGPU away first.
func TestDevmodelHold(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/a.sock", dir+"/ctl.sock"
	startDaemon(t, daemonConfig(t, dir, sock, ctl, ""), ctl)
	hold := func(domid int, name string) (*exec.Cmd, *lockedBuffer, chan error) {
		cmd := selfCommand(context.Background(), []string{"devmodel", "--hold", "--socket", sock, "--domid", strconv.Itoa(domid),
			"--name", name, "--ram", "64MiB", "--workloads", "nop", "--runs", "1"})
		out := &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill() })
		waitFor(t, name+" holding its vGPU", 30*time.Second, out.String, func() bool {
			return strings.Contains(out.String(), "holding vGPU") && listVGPUs(t, ctl)[name].PID == cmd.Process.Pid
		})
		return cmd, out, done
	}

	cmd, out, done := hold(3, "held")
	if !strings.Contains(out.String(), "board: virtual GPU (vgpu fv-optimized)") || !strings.Contains(out.String(), "nop") {
		t.Errorf("no results before holding:\n%s", out)
	}
	time.Sleep(3 * holdProbe) // a few probes of a healthy vGPU
	select {
	case err := <-done:
		t.Fatalf("devmodel --hold exited while holding: %v\n%s", err, out)
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("devmodel --hold after SIGTERM: %v, want exit 0\n%s", err, out)
	}
	if !strings.Contains(out.String(), "released") {
		t.Errorf("no word of the release:\n%s", out)
	}
	waitFor(t, "the released vGPU to go", 10*time.Second, out.String, func() bool { _, ok := listVGPUs(t, ctl)["held"]; return !ok })

	// The vGPU destroyed under it: the device model says so and exits 1.
	_, out, done = hold(4, "destroyed")
	req, _ := http.NewRequest(http.MethodDelete, "http://aggregator/v1/vgpus/"+strconv.Itoa(listVGPUs(t, ctl)["destroyed"].ID), nil)
	resp, err := controlClient(ctl).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitFailure {
			t.Errorf("devmodel --hold whose vGPU was destroyed: %v, want exit %d\n%s", err, exitFailure, out)
		}
		if !strings.Contains(out.String(), "the vGPU went while held") {
			t.Errorf("it does not say the vGPU went:\n%s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("devmodel --hold still runs after its vGPU was destroyed:\n%s", out)
	}
	if _, _, err := runApp(t, "devmodel", "--hold", "--fairness", "madd"); err == nil || !strings.Contains(err.Error(), "--hold") {
		t.Errorf("--hold with --fairness: %v", err)
	}

	// Stopped while still attaching (an aggregator that accepts and never
	// answers): it exits as interrupted, not as failed.
	mute := dir + "/mute.sock"
	ln, err := net.Listen("unixpacket", mute)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd = selfCommand(context.Background(), []string{"devmodel", "--hold", "--socket", mute, "--domid", "5", "--name", "early", "--ram", "64MiB"})
	out = &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	werr := make(chan error, 1)
	go func() { werr <- cmd.Wait() }()
	select {
	case err := <-werr:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitInterrupted {
			t.Errorf("devmodel --hold stopped while attaching: %v, want exit %d\n%s", err, exitInterrupted, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("devmodel --hold still attaching 30s after SIGTERM:\n%s", out)
	}
}

// libvirtd is a private libvirtd process.
type libvirtd struct {
	bin, dir, socket string
	env              []string
	cmd              *exec.Cmd
	done             chan error
	out              *lockedBuffer
}

// startLibvirtd starts a libvirtd of its own in dir: its config, sockets,
// pid file and log there, and no hypervisor driver modules (an empty
// LIBVIRT_DRIVER_DIR), so only the test driver built into libvirt serves
// (and, as root, nothing wants the libvirt-qemu user or /run/libvirt's
// locks). It skips the test, saying why, if libvirtd is missing or does
// not come up.
func startLibvirtd(t *testing.T) *libvirtd {
	t.Helper()
	bin, err := exec.LookPath("libvirtd")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/libvirtd"); serr != nil {
			t.Skipf("libvirtd is not installed (Debian: apt-get install --no-install-recommends libvirt-daemon): %v", err)
		}
		bin = "/usr/sbin/libvirtd"
	}
	dir, err := os.MkdirTemp("", "lv") // short: a Unix socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"run", "drivers", "xdg"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf("unix_sock_dir = %q\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\nlog_outputs = \"3:file:%s/libvirtd.log\"\n", dir+"/run", dir)
	if err := os.WriteFile(dir+"/libvirtd.conf", []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	x := dir + "/xdg"
	l := &libvirtd{bin: bin, dir: dir, socket: dir + "/run/libvirt-sock",
		env: append(os.Environ(), "LIBVIRT_DRIVER_DIR="+dir+"/drivers", "HOME="+x, "XDG_CONFIG_HOME="+x, "XDG_CACHE_HOME="+x, "XDG_RUNTIME_DIR="+x)}
	l.start(t, t.Skipf)
	t.Cleanup(func() {
		l.cmd.Process.Kill()
		<-l.done
	})
	return l
}

// start runs libvirtd and waits until test:///default answers on its
// socket; if it does not, fail says why (t.Skipf the first time: libvirtd
// cannot run here; t.Fatalf on a restart).
func (l *libvirtd) start(t *testing.T, fail func(format string, args ...any)) {
	t.Helper()
	l.cmd = exec.Command(l.bin, "--config", l.dir+"/libvirtd.conf", "--pid-file", l.dir+"/libvirtd.pid")
	l.cmd.Env, l.out = l.env, &lockedBuffer{}
	l.cmd.Stdout, l.cmd.Stderr = l.out, l.out
	if err := l.cmd.Start(); err != nil {
		fail("libvirtd (%s) does not start: %v", l.bin, err)
	}
	l.done = make(chan error, 1)
	go func() { l.done <- l.cmd.Wait() }()
	var err error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		select {
		case werr := <-l.done:
			l.done <- werr
			log, _ := os.ReadFile(l.dir + "/libvirtd.log")
			fail("libvirtd (%s) exited at start: %v\n%s%s", l.bin, werr, l.out, log)
		default:
		}
		var c *libvirt.Libvirt
		if c, err = l.connect(); err == nil {
			c.Disconnect()
			return
		}
	}
	log, _ := os.ReadFile(l.dir + "/libvirtd.log")
	fail("libvirtd (%s) did not serve test:///default within 30s: %v\n%s%s", l.bin, err, l.out, log)
}

// connect opens test:///default through the socket.
func (l *libvirtd) connect() (*libvirt.Libvirt, error) {
	c := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(l.socket), dialers.WithLocalTimeout(2*time.Second)))
	return c, c.ConnectToURI(libvirt.TestDefault)
}

// testDomain is a test-driver domain's XML with metadata.
func testDomain(name, metadata string) string {
	return `<domain type='test'><name>` + name + `</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>` +
		`<metadata>` + metadata + `</metadata></domain>`
}

// TestLibvirtLifecycle runs gpuvm libvirt against a real libvirtd (its
// test driver) and a real aggregator: domains get their vGPUs as their
// metadata asks when they start, lose them when they stop, and the
// watcher survives a libvirtd restart, reconciling with what runs after it.
func TestLibvirtLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("the libvirt lifecycle test runs without -short (it starts libvirtd, the daemon and device models)")
	}
	lv := startLibvirtd(t)
	dir := t.TempDir()
	sock, ctl := dir+"/a.sock", dir+"/ctl.sock"
	dmn := startDaemon(t, daemonConfig(t, dir, sock, ctl, ""), ctl)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon:\n%s", dmn.stderr)
		}
	})

	watcher := selfCommand(context.Background(), []string{"--log-level", "debug", "libvirt", "--connect", "test:///default", "--libvirt-socket", lv.socket,
		"--socket", sock, "--control-socket", ctl, "--reconnect-max", "200ms", "--harness-ram", "64MiB"})
	wout := &lockedBuffer{}
	watcher.Stderr, watcher.Stdout = wout, wout
	if err := watcher.Start(); err != nil {
		t.Fatal(err)
	}
	wdone := make(chan error, 1)
	go func() { wdone <- watcher.Wait() }()
	t.Cleanup(func() {
		watcher.Process.Kill()
		<-wdone
		if t.Failed() || testing.Verbose() {
			t.Logf("gpuvm libvirt:\n%s", wout)
		}
	})
	logs := func() string { return "gpuvm libvirt:\n" + wout.String() + "libvirtd:\n" + lv.out.String() }
	waitFor(t, "gpuvm libvirt to connect", 30*time.Second, logs, func() bool {
		select {
		case err := <-wdone:
			t.Fatalf("gpuvm libvirt exited: %v\n%s", err, logs())
		default:
		}
		return strings.Contains(wout.String(), "libvirt: reconciled")
	})

	c, err := lv.connect()
	if err != nil {
		t.Fatal(err)
	}
	create := func(name, metadata string) libvirt.Domain {
		t.Helper()
		d, err := c.DomainCreateXML(testDomain(name, metadata), 0)
		if err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		return d
	}
	// Attached, its workloads run, and holding the vGPU.
	held := func(name string) func() bool {
		return func() bool {
			return hasLine(wout.String(), "domain="+name, "holding vGPU") && listVGPUs(t, ctl)[name].PID != 0
		}
	}
	ns := `xmlns:gpuvm="` + vgpumeta.Namespace + `"`
	create("plain", "")
	create("bad", `<gpuvm:vgpu `+ns+` mode="fv-optimized" colour="red"/>`)
	example, err := os.ReadFile("../../examples/libvirt-domain.xml")
	if err != nil {
		t.Fatal(err)
	}
	vm1, err := c.DomainCreateXML(string(example), 0) // gpuvm-guest: pv-multicall, vgpu-128m
	if err != nil {
		t.Fatalf("creating examples/libvirt-domain.xml: %v", err)
	}
	waitFor(t, "the example domain's vGPU", 60*time.Second, logs, held("gpuvm-guest"))
	// Events are handled in order: plain and bad were seen before it.
	vg := listVGPUs(t, ctl)
	if v := vg["gpuvm-guest"]; v.Mode != "pv-multicall" || v.Profile != "vgpu-128m" || v.VRAMBytes != 128<<20 || v.DomID != uint32(vm1.ID) {
		t.Errorf("the example domain's vGPU: %+v; want pv-multicall, profile vgpu-128m (128 MiB), domid %d", v, vm1.ID)
	}
	if ppid := parentPID(t, vg["gpuvm-guest"].PID); ppid != watcher.Process.Pid {
		t.Errorf("the device model (pid %d) is a child of pid %d, not of gpuvm libvirt (%d)", vg["gpuvm-guest"].PID, ppid, watcher.Process.Pid)
	}
	if len(vg) != 1 {
		t.Errorf("vGPUs %v: only gpuvm-guest asks for one (plain has no metadata, bad's is wrong)", vg)
	}
	if !hasLine(wout.String(), "domain left without a vGPU", "domain=bad", `unknown attribute \"colour\"`) {
		t.Errorf("the log does not say why domain bad has no vGPU:\n%s", wout)
	}

	if err := c.DomainDestroy(vm1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the example domain's vGPU to go after destroy", 30*time.Second, logs, func() bool { _, ok := listVGPUs(t, ctl)["gpuvm-guest"]; return !ok })

	vm2 := create("vm2", `<gpuvm:vgpu `+ns+` vram="64MiB" channels="4" weight="2"/>`)
	waitFor(t, "vm2's vGPU", 60*time.Second, logs, held("vm2"))
	if v := listVGPUs(t, ctl)["vm2"]; v.Mode != "fv-optimized" || v.VRAMBytes != 64<<20 || v.DomID != uint32(vm2.ID) {
		t.Errorf("vm2's vGPU: %+v; want fv-optimized (the default), 64 MiB, domid %d", v, vm2.ID)
	}

	// libvirtd dies and comes back: the test driver starts afresh (only
	// its default domain "test" runs), so vm2 is gone and its vGPU must go.
	c.Disconnect()
	lv.cmd.Process.Kill()
	<-lv.done
	lv.start(t, t.Fatalf)
	waitFor(t, "vm2's vGPU to go after the libvirtd restart", 30*time.Second, logs, func() bool { _, ok := listVGPUs(t, ctl)["vm2"]; return !ok })
	if !strings.Contains(wout.String(), "connection lost; reconnecting") || !strings.Contains(wout.String(), "reconnection=true") {
		t.Errorf("the log does not tell the reconnection:\n%s", wout)
	}
	if c, err = lv.connect(); err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect()
	vm3 := create("vm3", `<gpuvm:vgpu `+ns+` mode="fv-lazy" profile="vgpu-64m"/>`)
	waitFor(t, "vm3's vGPU after the restart", 60*time.Second, logs, held("vm3"))
	if v := listVGPUs(t, ctl)["vm3"]; v.Mode != "fv-lazy" || v.Profile != "vgpu-64m" || v.DomID != uint32(vm3.ID) {
		t.Errorf("vm3's vGPU: %+v", v)
	}

	// A running persistent domain undefined runs on, transient: it keeps
	// its vGPU (the Undefined event seen, and handled before plain2's
	// Started), and loses it only when it stops.
	pers, err := c.DomainDefineXML(testDomain("pers", `<gpuvm:vgpu `+ns+` profile="vgpu-64m"/>`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DomainCreate(pers); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pers's vGPU", 60*time.Second, logs, held("pers"))
	persPID := listVGPUs(t, ctl)["pers"].PID
	if err := c.DomainUndefine(pers); err != nil {
		t.Fatal(err)
	}
	if state, _, _, _, _, err := c.DomainGetInfo(pers); err != nil || libvirt.DomainState(state) != libvirt.DomainRunning {
		t.Fatalf("pers after undefine: state %d, %v; the test driver should keep it running", state, err)
	}
	create("plain2", "")
	waitFor(t, "the Undefined event of pers", 30*time.Second, logs, func() bool {
		return hasLine(wout.String(), "lifecycle event", "domain=pers", fmt.Sprintf("event=%d", libvirt.DomainEventUndefined)) &&
			hasLine(wout.String(), "lifecycle event", "domain=plain2")
	})
	if v, ok := listVGPUs(t, ctl)["pers"]; !ok || v.PID != persPID {
		t.Errorf("pers, undefined but running, lost its vGPU: %+v (device model was pid %d)\n%s", v, persPID, logs())
	}
	if err := c.DomainDestroy(pers); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pers's vGPU to go after destroy", 30*time.Second, logs, func() bool { _, ok := listVGPUs(t, ctl)["pers"]; return !ok })

	// gpuvm libvirt stopping stops the device models it launched.
	watcher.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-wdone:
		wdone <- err
		if err != nil {
			t.Errorf("gpuvm libvirt after SIGTERM: %v, want exit 0\n%s", err, logs())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("gpuvm libvirt still runs 60s after SIGTERM:\n%s", logs())
	}
	waitFor(t, "every vGPU to go after gpuvm libvirt stopped", 30*time.Second, logs, func() bool { return len(listVGPUs(t, ctl)) == 0 })
}

// hasLine reports whether one line of log has every part.
func hasLine(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// parentPID is pid's parent's pid (/proc/PID/stat).
func parentPID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// TestLibvirtUsage: gpuvm libvirt refuses the connections it has no device
// model for, saying so, before it connects anywhere.
func TestLibvirtUsage(t *testing.T) {
	for _, tc := range []struct {
		uri, want string
	}{
		{"xen:///system", "not implemented yet"},
		{"qemu:///system", "a qemu domain cannot use them"},
		{"no uri", "want a libvirt URI"},
	} {
		_, _, err := runApp(t, "libvirt", "--connect", tc.uri, "--libvirt-socket", t.TempDir()+"/none")
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--connect %s: %v, want a usage error containing %q", tc.uri, err, tc.want)
		}
	}
}

// TestLibvirtRegistryHint: the vGPU settings of a libvirt domain sent to
// no aggregator say which one to start (no Xen about it).
func TestLibvirtRegistryHint(t *testing.T) {
	r := controlRegistry{socket: t.TempDir() + "/ctl.sock"}
	for what, err := range map[string]error{
		"Register": r.Register(context.Background(), 3, vgpumeta.VGPU{Mode: "fv-optimized"}),
		"Forget":   r.Forget(context.Background(), 3),
	} {
		if err == nil || !strings.Contains(err.Error(), "is gpuvm serve running") || strings.Contains(err.Error(), "--xen") {
			t.Errorf("%s with no aggregator: %v; want the hint to run gpuvm serve", what, err)
		}
	}
}
