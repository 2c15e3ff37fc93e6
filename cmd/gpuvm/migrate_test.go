package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// TestMigrateAcrossDaemons is issue 18's live migration with real
// processes: two `gpuvm serve` daemons, each with its own sockets and
// simulated board; a VM process loops verified madd and cpy on daemon a
// beside an honest VM. A migration whose destination command refuses
// (its daemon unreachable) leaves the vGPU on a, the VM computing. Then
// `gpuvm vgpu migrate --ssh` carries the stream through a command's
// stdin/stdout — `gpuvm vgpu migrate-receive` against b's control socket,
// as ssh would run it on another host — while the VM keeps computing;
// on b's ok the vGPU goes from a, the VM's device model resumes on b and
// every one of its runs verifies. The honest VM on a computes verified
// madd throughout, on the same vGPU.
func TestMigrateAcrossDaemons(t *testing.T) {
	dir := t.TempDir()
	sockA, ctlA := dir+"/a.sock", dir+"/actl.sock"
	sockB, ctlB := dir+"/b.sock", dir+"/bctl.sock"
	startDaemon(t, daemonConfig(t, dir, sockA, ctlA, ""), ctlA)
	startDaemon(t, daemonConfig(t, dir, sockB, ctlB, ""), ctlB)
	honest := startComputingVM(t, sockA, ctlA, "honest", 8)

	const pairs = 80
	wl := strings.TrimSuffix(strings.Repeat("madd,cpy,", pairs), ",")
	vm := selfCommand(context.Background(), []string{"--log-level", "info", "devmodel", "--socket", sockA, "--resume-socket", sockB, "--resume-socket", sockA, "--resume-timeout", "2m",
		"--name", "migrated", "--domid", "7", "--ram", "64MiB", "--workloads", wl, "--runs", "1", "--no-warmup",
		"--matrix-dim", "32", "--copy-size", "256KiB", "--json"})
	var vmOut, vmErr bytes.Buffer
	vm.Stdout, vm.Stderr = &vmOut, &vmErr
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- vm.Wait() }()
	t.Cleanup(func() { vm.Process.Kill(); <-exited })
	waitComputing(t, ctlA, "migrated")
	v, ok := vgpuNamed(t, ctlA, "migrated")
	if !ok {
		t.Fatal("the VM's vGPU is not on a")
	}
	honestBefore, _ := vgpuNamed(t, ctlA, "honest")
	exe := selfCommand(context.Background(), nil).Path

	// A destination that cannot take it: the vGPU stays on a and computes.
	_, errOut, code := runCLI(t, "vgpu", "migrate", "--control-socket", ctlA, strconv.Itoa(v.ID),
		"--ssh", exe+" vgpu migrate-receive --control-socket "+dir+"/nowhere.sock")
	if code != exitFailure || !strings.Contains(errOut, "stays on the source") {
		t.Fatalf("migration to a destination without a daemon: exit %d\n%s", code, errOut)
	}
	t.Logf("refused: %s", strings.TrimSpace(errOut))
	stayed, ok := vgpuNamed(t, ctlA, "migrated")
	if !ok || stayed.ID != v.ID {
		t.Fatal("the vGPU left a after a refused migration")
	}
	deadline := time.Now().Add(2 * time.Minute) // a hang guard only
	for now, _ := vgpuNamed(t, ctlA, "migrated"); now.Sched.Submissions <= stayed.Sched.Submissions; now, _ = vgpuNamed(t, ctlA, "migrated") {
		if time.Now().After(deadline) {
			t.Fatal("the VM did not compute on a after the refused migration")
		}
		time.Sleep(10 * time.Millisecond)
	}

	start := time.Now()
	out, errOut, code := runCLI(t, "vgpu", "migrate", "--control-socket", ctlA, strconv.Itoa(v.ID),
		"--ssh", exe+" vgpu migrate-receive --control-socket "+ctlB)
	if code != 0 {
		t.Fatalf("gpuvm vgpu migrate: exit %d\n%s%s", code, out, errOut)
	}
	took := time.Since(start)
	var st aggregator.MigrateStats
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Rounds) == 0 || st.InUse == 0 {
		t.Fatalf("migrate printed %q (%v)", out, err)
	}
	if _, ok := vgpuNamed(t, ctlA, "migrated"); ok {
		t.Fatal("the migrated vGPU is still on a")
	}

	waitComputingOn := func(ctl string) bool {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute) // a hang guard only
		var first aggregator.VGPUInfo
		for {
			nv, ok := vgpuNamed(t, ctl, "migrated")
			if ok && first.Name == "" {
				first = nv
			}
			if ok && nv.Sched.Submissions > first.Sched.Submissions {
				return true
			}
			select {
			case err := <-exited:
				exited <- err
				if first.Name != "" {
					return false // it finished its runs before a second look
				}
				t.Fatalf("the VM ended before it computed on %s: %v\n%s", ctl, err, vmErr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("the VM did not compute on %s: %+v\n%s", ctl, nv, vmErr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !waitComputingOn(ctlB) {
		t.Fatal("the VM finished on b before it could be migrated back")
	}
	// And back to a, through a's control socket this time.
	back, ok := vgpuNamed(t, ctlB, "migrated")
	if !ok {
		t.Fatal("the VM's vGPU is not on b")
	}
	out, errOut, code = runCLI(t, "vgpu", "migrate", "--control-socket", ctlB, strconv.Itoa(back.ID), "--to-control", ctlA)
	if code != 0 {
		t.Fatalf("gpuvm vgpu migrate --to-control: exit %d\n%s%s", code, out, errOut)
	}
	var stBack aggregator.MigrateStats
	if err := json.Unmarshal([]byte(out), &stBack); err != nil {
		t.Fatalf("migrate printed %q (%v)", out, err)
	}
	if _, ok := vgpuNamed(t, ctlB, "migrated"); ok {
		t.Fatal("the vGPU migrated back is still on b")
	}
	waitComputingOn(ctlA)
	if err := <-exited; err != nil {
		exited <- err
		t.Fatalf("the VM failed after its migration: %v\n%s\n%s", err, vmOut.String(), vmErr.String())
	}
	exited <- nil
	checkVerified(t, "the VM", vmOut.Bytes(), 2*pairs)

	resumed := regexp.MustCompile(`resumed on the restored vGPU.* pause=(\S+)`).FindAllStringSubmatch(vmErr.String(), -1)
	if len(resumed) != 2 {
		t.Fatalf("the device model said it resumed %d times, want 2:\n%s", len(resumed), vmErr.String())
	}
	m := resumed[0]
	t.Logf("migrate (exec'ed CLI through a command's pipes) %v: %d rounds %v, %d bytes in use, %d sent after the park, downtime to b's ok %v; the device model's own pause, Bye to Welcome: %s; back to a: downtime %v, device model's pause %s",
		took.Round(time.Millisecond), len(st.Rounds), st.Rounds, st.InUse, st.FinalBytes, st.DowntimeNs, m[1], stBack.DowntimeNs, resumed[1][1])

	if err := honest.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the honest VM on a ended (a run failed or did not verify): %v", err)
	}
	if after, ok := vgpuNamed(t, ctlA, "honest"); !ok || after.Sched.Submissions <= honestBefore.Sched.Submissions || after.ID != honestBefore.ID {
		t.Errorf("the honest VM on a: before %+v, after %+v (present %v)", honestBefore.Sched, after.Sched, ok)
	}
}

// TestMigratePVDRMAcrossDaemons: a pvdrm-pooling VM process looping
// verified madd and cpy migrates from daemon a to daemon b
// (`gpuvm vgpu migrate --to-control`) while it runs: its back end stops
// between two requests only for the stop-and-copy, its front end resumes
// on b on the migration's saved Bye with the same ring and GART heap, and
// every run verifies.
func TestMigratePVDRMAcrossDaemons(t *testing.T) {
	dir := t.TempDir()
	sockA, ctlA := dir+"/a.sock", dir+"/actl.sock"
	sockB, ctlB := dir+"/b.sock", dir+"/bctl.sock"
	startDaemon(t, daemonConfig(t, dir, sockA, ctlA, ""), ctlA)
	startDaemon(t, daemonConfig(t, dir, sockB, ctlB, ""), ctlB)
	vm := startSizedLoopVM(t, sockA, "drm", 17, 40, "256KiB", "--mode", "pvdrm-pooling", "--resume-socket", sockB, "--resume-socket", sockA)
	waitComputing(t, ctlA, "drm")
	v, _ := vgpuNamed(t, ctlA, "drm")
	out, errOut, code := runCLI(t, "vgpu", "migrate", "--control-socket", ctlA, strconv.Itoa(v.ID), "--to-control", ctlB)
	if code != 0 {
		t.Fatalf("gpuvm vgpu migrate: exit %d\n%s%s\n%s", code, out, errOut, vm.logs.String())
	}
	var st aggregator.MigrateStats
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Rounds) == 0 {
		t.Fatalf("migrate printed %q (%v)", out, err)
	}
	if _, ok := vgpuNamed(t, ctlA, "drm"); ok {
		t.Fatal("the migrated vGPU is still on a")
	}
	pause := vm.finish(t, true)
	t.Logf("pvdrm-pooling migrated: %d rounds, %d bytes in use, %d sent after the park, downtime %v; the front end's pause %s",
		len(st.Rounds), st.InUse, st.FinalBytes, st.DowntimeNs, pause)
}
