package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// runCLI runs gpuvm args as its own process (the real CLI, exec'ed) and
// returns its stdout, stderr and exit status.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard only
	defer cancel()
	cmd := selfCommand(ctx, args)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("gpuvm %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// TestSaveRestoreAcrossDaemons is issue 18's save → restore on a second
// daemon with real processes: two `gpuvm serve` daemons, each with its own
// sockets and simulated board; a VM process loops verified madd and cpy on
// daemon a; a save to a file that cannot be stored is aborted and the VM
// goes on computing on a; `gpuvm vgpu save` takes its vGPU through a's
// control socket;
// two hostile images (the file truncated, one byte flipped) given to
// `gpuvm vgpu restore` on b are refused with the decoder's reason and exit
// status 1, nothing attached — the VM, asking b for its vGPU all the
// while, is not given one; the real image restored on b is taken by the
// VM's device model, which resumes there, and its remaining runs verify.
// An honest VM on b computes verified madd throughout (its process would
// end at a run that failed or did not verify).
func TestSaveRestoreAcrossDaemons(t *testing.T) {
	dir := t.TempDir()
	sockA, ctlA := dir+"/a.sock", dir+"/actl.sock"
	sockB, ctlB := dir+"/b.sock", dir+"/bctl.sock"
	startDaemon(t, daemonConfig(t, dir, sockA, ctlA, ""), ctlA)
	startDaemon(t, daemonConfig(t, dir, sockB, ctlB, ""), ctlB)
	honest := startComputingVM(t, sockB, ctlB, "honest", 8)

	// The VM: madd and cpy in turn, one verified run each, many times.
	const pairs = 40
	wl := strings.TrimSuffix(strings.Repeat("madd,cpy,", pairs), ",")
	vm := selfCommand(context.Background(), []string{"--log-level", "info", "devmodel", "--socket", sockA, "--resume-socket", sockB, "--resume-timeout", "2m",
		"--name", "saved", "--domid", "7", "--ram", "64MiB", "--workloads", wl, "--runs", "1", "--no-warmup",
		"--matrix-dim", "32", "--copy-size", "256KiB", "--json"})
	var vmOut, vmErr bytes.Buffer
	vm.Stdout, vm.Stderr = &vmOut, &vmErr
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- vm.Wait() }()
	t.Cleanup(func() { vm.Process.Kill(); <-exited })
	waitComputing(t, ctlA, "saved")
	saved, ok := vgpuNamed(t, ctlA, "saved")
	if !ok {
		t.Fatal("the VM's vGPU is not on a")
	}
	honestBefore, _ := vgpuNamed(t, ctlB, "honest")

	// A save whose image cannot be stored is aborted: the vGPU is not
	// destroyed, and the VM computes on a right after.
	out, errOut, code := runCLI(t, "vgpu", "save", "--control-socket", ctlA, strconv.Itoa(saved.ID), dir+"/no/such/dir/saved.img")
	if code != exitFailure || !strings.Contains(errOut, "resumes") {
		t.Fatalf("a save to a directory that does not exist: exit %d, want %d saying the vGPU resumes\n%s%s", code, exitFailure, out, errOut)
	}
	aborted, ok := vgpuNamed(t, ctlA, "saved")
	if !ok || aborted.ID != saved.ID {
		t.Fatalf("after an aborted save the VM's vGPU is gone from a (%+v)", aborted)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) { // a hang guard only
		if v, _ := vgpuNamed(t, ctlA, "saved"); v.Sched.Submissions > aborted.Sched.Submissions {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the VM did not compute on a after the aborted save")
		}
	}

	img := dir + "/saved.img"
	start := time.Now()
	if out, errOut, code := runCLI(t, "vgpu", "save", "--control-socket", ctlA, strconv.Itoa(saved.ID), img); code != 0 {
		t.Fatalf("gpuvm vgpu save: exit %d\n%s%s", code, out, errOut)
	}
	saveTook := time.Since(start)
	if _, ok := vgpuNamed(t, ctlA, "saved"); ok {
		t.Fatal("the saved vGPU is still on a")
	}

	// Hostile images: refused with the decoder's reason, nothing attached.
	data, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 0x40
	for _, h := range []struct {
		name string
		data []byte
		want string
	}{
		{"truncated", data[:len(data)-100], "truncated"},
		{"flipped", flipped, "checksum"},
	} {
		f := dir + "/" + h.name + ".img"
		if err := os.WriteFile(f, h.data, 0o600); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := runCLI(t, "vgpu", "restore", "--control-socket", ctlB, "--domid", "7", f)
		if code != exitFailure || !strings.Contains(errOut, "400") || !strings.Contains(errOut, h.want) {
			t.Errorf("restore of a %s image: exit %d, want %d with %q\nstdout: %s\nstderr: %s", h.name, code, exitFailure, h.want, out, errOut)
		}
	}
	if _, ok := vgpuNamed(t, ctlB, "saved"); ok {
		t.Fatal("a hostile image gave the VM a vGPU on b")
	}
	select {
	case err := <-exited:
		t.Fatalf("the VM ended while its vGPU was saved: %v\n%s", err, vmErr.String())
	default:
	}

	if out, errOut, code := runCLI(t, "vgpu", "restore", "--control-socket", ctlB, "--domid", "7", img); code != 0 {
		t.Fatalf("gpuvm vgpu restore: exit %d\n%s%s", code, out, errOut)
	}
	// The VM comes back on b and computes there: its submissions, which
	// the image carried over, grow.
	deadline := time.Now().Add(2 * time.Minute) // a hang guard only
	var first aggregator.VGPUInfo
	var resumedAfter time.Duration
waitB:
	for {
		v, ok := vgpuNamed(t, ctlB, "saved")
		if ok && first.Name == "" {
			first, resumedAfter = v, time.Since(start)
		}
		if ok && v.Sched.Submissions > first.Sched.Submissions {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			if first.Name != "" {
				break waitB // it finished its runs on b before a second look
			}
			t.Fatalf("the VM ended before it computed on b: %v\n%s", err, vmErr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the VM did not compute on b: %+v\n%s", v, vmErr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-exited; err != nil {
		exited <- err
		t.Fatalf("the VM failed after its restore: %v\n%s\n%s", err, vmOut.String(), vmErr.String())
	}
	exited <- nil
	checkVerified(t, "the VM", vmOut.Bytes(), 2*pairs)

	if m := regexp.MustCompile(`resumed on the restored vGPU.* pause=(\S+)`).FindStringSubmatch(vmErr.String()); m == nil {
		t.Errorf("the device model did not say it resumed:\n%s", vmErr.String())
	} else {
		t.Logf("save (exec'ed CLI) %v; save → restore → VM on b %v (the device model's own pause, Bye to Welcome, %s, includes both hostile restores)",
			saveTook.Round(time.Millisecond), resumedAfter.Round(time.Millisecond), m[1])
	}

	if err := honest.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the honest VM on b ended (a run failed or did not verify): %v", err)
	}
	if after, ok := vgpuNamed(t, ctlB, "honest"); !ok || after.Sched.Submissions <= honestBefore.Sched.Submissions || after.ID != honestBefore.ID {
		t.Errorf("the honest VM on b: before %+v, after %+v (present %v)", honestBefore.Sched, after.Sched, ok)
	}
}
