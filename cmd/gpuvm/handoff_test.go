package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/host"
)

// TestRestartUnderFourVMs is issue 18's daemon upgrade with real
// processes: `gpuvm serve`, run from a binary installed in the test's
// directory, serves four VM processes looping verified madd and cpy and an
// honest VM (this test's own device model) with a marker in the first and
// last page of its VRAM. A new binary is installed over the old one and
// the daemon gets SIGUSR2: the same PID goes on running the new binary,
// serving on the sockets the old process handed over; each VM's device
// model resumes there and every run of every VM verifies. The board's
// VRAM is handed over with it: every vGPU's VRAM stays in its slot, and
// the new process restores each in place. The honest VM's marker reads
// back unchanged through its restored vGPU, and none of the four VM
// processes' memfd memory (guest RAM, VRAM slice) ever held it.
func TestRestartUnderFourVMs(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/gpuvm.sock", dir+"/ctl.sock"
	exe := dir + "/gpuvm"
	installGpuvm(t, exe, nil)
	d, logs, done := startInstalledDaemon(t, exe, handoffConfig(t, dir, sock, ctl), ctl)
	pid := d.Process.Pid

	honest := connectMarkedVM(t, sock, "honest", 30)
	honest.plant()
	if p, ok := honest.check(); !ok {
		t.Fatalf("the marker at VRAM %#x does not read back before the restart", p)
	}
	var vms []*loopVM
	for i, name := range []string{"vm1", "vm2", "vm3", "vm4"} {
		vms = append(vms, startLoopVM(t, sock, name, 31+i, 40))
	}
	for _, vm := range vms {
		waitComputing(t, ctl, vm.name)
		v, _ := vgpuNamed(t, ctl, vm.name)
		vm.submissions = v.Sched.Submissions
	}

	installGpuvm(t, exe, nil) // the upgrade: a new file at the binary's path
	if !exeDeleted(t, pid) {
		t.Fatal("the daemon's binary was not replaced on disk")
	}
	sent := time.Now()
	usr2(t, d)
	deadline := time.Now().Add(2 * time.Minute) // a hang guard only
	for !strings.Contains(logs.String(), "serving on the sockets the previous process handed over") {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the daemon exited at the handoff: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new process serves:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	serving := time.Since(sent)
	if exeDeleted(t, pid) {
		t.Error("the daemon still runs the replaced binary after the handoff")
	}
	// Every VM comes back on the new process and computes there: its
	// submissions, which its image carried over, grow.
	for _, vm := range vms {
		finished := false // its last runs were on the new process, and it is done
		for !finished {
			v, ok := vgpuNamed(t, ctl, vm.name)
			resumed := strings.Contains(vm.logs.String(), "resumed on the restored vGPU")
			if ok && v.Sched.Submissions > vm.submissions && resumed {
				break
			}
			select {
			case err := <-vm.exited:
				vm.exited <- err
				// Under -race a VM may finish its runs on the new process
				// before a look finds it there; vm.finish checks them.
				if err != nil || !strings.Contains(vm.logs.String(), "resumed on the restored vGPU") {
					t.Fatalf("VM %s ended before it computed on the new process: %v\n%s", vm.name, err, vm.logs.String())
				}
				finished = true
				continue
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("VM %s does not compute on the new process: %+v\n%s\n%s", vm.name, v, vm.logs.String(), logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !finished && memoryHolds(t, vm.cmd.Process.Pid, honest.marker) {
			t.Errorf("VM %s's memory holds the honest VM's marker", vm.name)
		}
	}
	if p, ok := honest.check(); !ok {
		t.Errorf("the honest VM's marker at VRAM %#x changed across the restart", p)
	}
	if honest.dev.Resumes() != 1 {
		t.Errorf("the honest VM's device model resumed %d times, want 1", honest.dev.Resumes())
	}
	if n := strings.Count(logs.String(), "vram_in_place=true"); n != 5 {
		t.Errorf("%d vGPUs' VRAM kept in place across the handoff, want all 5:\n%s", n, logs)
	}
	var pauses []string
	for _, vm := range vms {
		pauses = append(pauses, vm.name+" "+vm.finish(t, true))
	}
	if d.Process.Pid != pid {
		t.Fatal("the daemon's PID changed")
	}
	select {
	case err := <-done:
		t.Fatalf("the daemon exited: %v\n%s", err, logs)
	default:
	}
	t.Logf("SIGUSR2 → new process serving %v; the device models' pauses (saved Bye → Welcome): %s",
		serving.Round(time.Millisecond), strings.Join(pauses, ", "))
}

// TestFailedHandoffKeepsServing: a handoff whose exec fails — the binary
// installed over the daemon's is not one (a broken upgrade: execve says
// ENOEXEC, after every vGPU was handed off and its device model told to
// resume) — leaves the same process serving: the images go back to its
// own boards, both VMs resume there and every run verifies, the marker
// of the honest VM reads back unchanged, and the device socket accepts a
// new VM, which computes.
func TestFailedHandoffKeepsServing(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/gpuvm.sock", dir+"/ctl.sock"
	exe := dir + "/gpuvm"
	installGpuvm(t, exe, nil)
	d, logs, done := startInstalledDaemon(t, exe, handoffConfig(t, dir, sock, ctl), ctl)

	honest := connectMarkedVM(t, sock, "honest", 40)
	honest.plant()
	vms := []*loopVM{startLoopVM(t, sock, "vm1", 41, 30), startLoopVM(t, sock, "vm2", 42, 30)}
	for _, vm := range vms {
		waitComputing(t, ctl, vm.name)
	}
	installGpuvm(t, exe, []byte("not a gpuvm binary\n"))
	usr2(t, d)
	deadline := time.Now().Add(2 * time.Minute) // a hang guard only
	for !strings.Contains(logs.String(), "handoff failed: still serving here") {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the daemon exited at the failed handoff: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handoff did not fail:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "exec format error") {
		t.Errorf("the failure does not say why:\n%s", logs)
	}
	if strings.Contains(logs.String(), "serving on the sockets the previous process handed over") {
		t.Fatalf("a new process serves:\n%s", logs)
	}
	if !exeDeleted(t, d.Process.Pid) {
		t.Error("the daemon does not run its old binary any more")
	}
	late := startLoopVM(t, sock, "late", 43, 2)
	if p, ok := honest.check(); !ok {
		t.Errorf("the honest VM's marker at VRAM %#x changed", p)
	}
	for _, vm := range vms {
		t.Logf("%s paused %s", vm.name, vm.finish(t, true))
	}
	late.finish(t, false)
	if honest.dev.Resumes() != 1 {
		t.Errorf("the honest VM's device model resumed %d times, want 1", honest.dev.Resumes())
	}
	select {
	case err := <-done:
		t.Fatalf("the daemon exited: %v\n%s", err, logs)
	default:
	}
}

// TestHandoffOfPVDRM: pvdrm vGPUs of the local transport (a pvdrm and a
// pvdrm-pooling VM, looping verified madd and cpy) are handed to the new
// process beside an fv one: each back end stops between two requests, its
// image carries its files, channels and buffers, and its front end
// resumes on the new process on the saved Bye and finishes every run
// verified; the honest VM's marker reads back.
func TestHandoffOfPVDRM(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/gpuvm.sock", dir+"/ctl.sock"
	exe := dir + "/gpuvm"
	installGpuvm(t, exe, nil)
	d, logs, done := startInstalledDaemon(t, exe, handoffConfig(t, dir, sock, ctl), ctl)
	honest := connectMarkedVM(t, sock, "honest", 49)
	honest.plant()
	vms := []*loopVM{
		startSizedLoopVM(t, sock, "pv", 50, 30, "256KiB", "--mode", "pvdrm"),
		startSizedLoopVM(t, sock, "pool", 51, 30, "256KiB", "--mode", "pvdrm-pooling"),
		startLoopVM(t, sock, "fv", 52, 30),
	}
	for _, vm := range vms {
		waitComputing(t, ctl, vm.name)
	}
	usr2(t, d)
	deadline := time.Now().Add(2 * time.Minute) // a hang guard only
	for !strings.Contains(logs.String(), "serving on the sockets the previous process handed over") {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the daemon exited at the handoff: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new process serves:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if strings.Contains(logs.String(), "handoff failed") {
		t.Fatalf("the handoff failed:\n%s", logs)
	}
	for _, vm := range vms {
		t.Logf("%s paused %s", vm.name, vm.finish(t, true))
	}
	if p, ok := honest.check(); !ok {
		t.Errorf("the honest VM's marker at VRAM %#x changed across the restart", p)
	}
	select {
	case err := <-done:
		t.Fatalf("the daemon exited: %v\n%s", err, logs)
	default:
	}
}

// TestHandoffCarriesWaitingImage: a state image registered for a domain
// whose device model has not come (gpuvm vgpu restore) crosses a handoff:
// the new process checks it again and holds it for the domain, whose next
// device model gets its vGPU from it. Settings a toolstack registered for
// a domain, and the board's cordon, cross too.
func TestHandoffCarriesWaitingImage(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/gpuvm.sock", dir+"/ctl.sock"
	exe := dir + "/gpuvm"
	installGpuvm(t, exe, nil)
	d, logs, _ := startInstalledDaemon(t, exe, handoffConfig(t, dir, sock, ctl), ctl)
	vm := startLoopVM(t, sock, "saved", 70, 200)
	waitComputing(t, ctl, "saved")
	v, _ := vgpuNamed(t, ctl, "saved")
	img := dir + "/saved.img"
	if out, errOut, code := runCLI(t, "vgpu", "save", "--control-socket", ctl, strconv.Itoa(v.ID), img); code != 0 {
		t.Fatalf("gpuvm vgpu save: exit %d\n%s%s", code, out, errOut)
	}
	vm.cmd.Process.Kill() // the domain's device model goes before its restore
	<-vm.exited
	vm.exited <- nil
	if out, errOut, code := runCLI(t, "vgpu", "restore", "--control-socket", ctl, "--domid", "70", img); code != 0 {
		t.Fatalf("gpuvm vgpu restore: exit %d\n%s%s", code, out, errOut)
	}
	settings := aggregator.DomainSettings{Mode: "fv-optimized", Weight: 3, Channels: 8}
	if err := putDomainSettings(context.Background(), ctl, 71, settings); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runCLI(t, "board", "cordon", "--control-socket", ctl, "gpu0"); code != 0 {
		t.Fatalf("gpuvm board cordon: exit %d\n%s%s", code, out, errOut)
	}
	usr2(t, d)
	deadline := time.Now().Add(time.Minute) // a hang guard only
	for !strings.Contains(logs.String(), "serving on the sockets the previous process handed over") {
		if time.Now().After(deadline) {
			t.Fatalf("no new process serves:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, after, _ := strings.Cut(logs.String(), "handoff: exec'ing the new daemon process")
	if !strings.Contains(after, `msg="state image registered" board=gpu0 domid=70`) {
		t.Fatalf("the new process holds no image for domain 70:\n%s", after)
	}
	var domains map[string]aggregator.DomainSettings
	if err := controlGet(context.Background(), ctl, "/v1/domains", &domains); err != nil {
		t.Fatal(err)
	}
	if got := domains["71"]; got != settings {
		t.Errorf("domain 71's settings after the handoff: %+v, want %+v (all: %v)", got, settings, domains)
	}
	var boards []host.BoardInfo
	if err := controlGet(context.Background(), ctl, "/v1/boards", &boards); err != nil {
		t.Fatal(err)
	}
	if len(boards) != 1 || boards[0].State != host.StateCordoned {
		t.Errorf("boards after the handoff: %+v, want gpu0 cordoned", boards)
	}
	if out, errOut, code := runCLI(t, "board", "uncordon", "--control-socket", ctl, "gpu0"); code != 0 {
		t.Fatalf("gpuvm board uncordon: exit %d\n%s%s", code, out, errOut)
	}
	// The domain's next device model: a fresh one, whose driver starts
	// over a vGPU it did not set up (only a resuming device model goes on
	// from a restored state), so only its attach is looked at.
	next := selfCommand(context.Background(), []string{"devmodel", "--socket", sock, "--name", "saved", "--domid", "70",
		"--ram", "64MiB", "--workloads", "nop", "--runs", "1"})
	_ = next.Run()
	if !regexp.MustCompile(`msg="vGPU restored from a state image".* domid=70 name=saved`).MatchString(logs.String()) {
		t.Errorf("the domain's next device model did not get the image's vGPU:\n%s", logs)
	}
}

// TestDaemonKilledIsNoHandoff: SIGKILL is not a handoff. The daemon's
// VMs get no saved Bye, so none waits to resume: a VM process fails at
// its next access instead of hanging, and the honest VM's device reads
// all-ones from then on. A daemon started afresh on the same sockets
// serves, and gives neither VM a vGPU.
func TestDaemonKilledIsNoHandoff(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/gpuvm.sock", dir+"/ctl.sock"
	exe := dir + "/gpuvm"
	installGpuvm(t, exe, nil)
	conf := handoffConfig(t, dir, sock, ctl)
	d, _, done := startInstalledDaemon(t, exe, conf, ctl)
	honest := connectMarkedVM(t, sock, "honest", 80)
	honest.plant()
	vm := startLoopVM(t, sock, "vm1", 81, 200)
	waitComputing(t, ctl, "vm1")
	if err := d.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-done
	done <- err
	select {
	case err := <-vm.exited:
		vm.exited <- err
		if err == nil {
			t.Fatal("the VM finished its 400 runs without its daemon")
		}
	case <-time.After(time.Minute):
		t.Fatalf("the VM hangs after its daemon was killed:\n%s", vm.logs.String())
	}
	if strings.Contains(vm.logs.String(), "waiting for its restore") {
		t.Errorf("the VM waits to resume after a crash:\n%s", vm.logs.String())
	}
	if v := honest.dev.Read32(0, nvc0.RegBoot0); v != 0xFFFFFFFF || honest.dev.Err() == nil {
		t.Errorf("the honest VM's device still answers after its daemon was killed: %#x, %v", v, honest.dev.Err())
	}
	startInstalledDaemon(t, exe, conf, ctl)
	time.Sleep(500 * time.Millisecond)
	for _, name := range []string{"honest", "vm1"} {
		if v, ok := vgpuNamed(t, ctl, name); ok {
			t.Errorf("the new daemon gave %s a vGPU: %+v", name, v)
		}
	}
	if honest.dev.Resumes() != 0 {
		t.Error("the honest VM's device model resumed after a crash")
	}
}

// TestHandoffTwice: the new process can itself be handed off — its
// signal is armed from its start, the sockets it inherited are handed on,
// and the manifest it read is no longer in its environment — and a VM
// resumes across both handoffs, every run verified. Before the second,
// the configuration gives the board another slot: the VRAM handed over no
// longer has the board's shape, and the VM's VRAM, kept in its slot, is
// read out of it into its image instead of restored in place; a marked
// VM's marker in its first and last VRAM page reads back after both.
func TestHandoffTwice(t *testing.T) {
	dir := t.TempDir()
	sock, ctl := dir+"/gpuvm.sock", dir+"/ctl.sock"
	exe := dir + "/gpuvm"
	installGpuvm(t, exe, nil)
	d, logs, done := startInstalledDaemon(t, exe, handoffConfig(t, dir, sock, ctl), ctl)
	marked := connectMarkedVM(t, sock, "marked", 91)
	marked.plant()
	vm := startLoopVM(t, sock, "twice", 90, 60)
	waitComputing(t, ctl, "twice")
	deadline := time.Now().Add(2 * time.Minute) // a hang guard only
	for round := 1; round <= 2; round++ {
		before, _ := vgpuNamed(t, ctl, "twice")
		if round == 2 {
			reshape(t, dir+"/handoff.toml", "max_vms = 5", "max_vms = 6")
		}
		usr2(t, d)
		for strings.Count(logs.String(), "serving on the sockets the previous process handed over") < round {
			select {
			case err := <-done:
				done <- err
				t.Fatalf("the daemon exited at handoff %d: %v\n%s", round, err, logs)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("handoff %d: no new process serves:\n%s", round, logs)
			}
			time.Sleep(5 * time.Millisecond)
		}
		for {
			if v, ok := vgpuNamed(t, ctl, "twice"); ok && v.Sched.Submissions > before.Sched.Submissions {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("handoff %d: the VM does not compute on the new process:\n%s", round, vm.logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	vm.finish(t, true)
	if in, out := strings.Count(logs.String(), "vram_in_place=true"), strings.Count(logs.String(), "vram_in_place=false"); in != 2 || out != 2 {
		t.Errorf("VRAM restored in place %d times and read out %d times, want twice each (two VMs, two handoffs):\n%s", in, out, logs)
	}
	if p, ok := marked.check(); !ok {
		t.Errorf("the marked VM's marker at VRAM %#x changed across the handoffs", p)
	}
	// An idle device model may still be waiting to resume at the second
	// handoff: its image then crosses as a waiting one, its VRAM kept too.
	if n := marked.dev.Resumes(); n < 1 || n > 2 {
		t.Errorf("the marked VM's device model resumed %d times, want 1 or 2", n)
	}
	if n := strings.Count(vm.logs.String(), "resumed on the restored vGPU"); n != 2 {
		t.Errorf("the VM resumed %d times, want 2:\n%s", n, vm.logs.String())
	}
	env, err := os.ReadFile("/proc/" + strconv.Itoa(d.Process.Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	// The variable is unset in the Go process, which /proc shows only for
	// what the exec passed: the third process was exec'ed without the
	// second's manifest, with a manifest of its own.
	if n := strings.Count(string(env), handoffEnv+"="); n != 1 {
		t.Errorf("the daemon's environment holds %d %s variables", n, handoffEnv)
	}
}
