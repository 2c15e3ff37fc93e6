package main

import (
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var handoffTable = flag.Bool("handoff.table", false, "TestHandoffPauseTable: measure the pause of a daemon restart (SIGUSR2) against the VRAM in use")

// TestHandoffPauseTable measures what guests see of a restart of `gpuvm
// serve` (SIGUSR2): four VMs loop madd and cpy, cpy moving a given size
// each way (so much VRAM in use), and the daemon hands them to a new
// process of itself. For each VM: the VRAM it had in use, what its image
// carried (its VRAM stays in place on the board handed over: only its
// state), and its pause — from its vGPU's park on the old process to its
// restore on the new one, both from the daemon's log — and its device
// model's own (saved Bye to Welcome). docs/performance.md has the table:
//
//	go test ./cmd/gpuvm -run TestHandoffPauseTable -handoff.table -v
func TestHandoffPauseTable(t *testing.T) {
	if !*handoffTable {
		t.Skip("a measurement: -handoff.table")
	}
	var rows []string
	for _, size := range []string{"256KiB", "8MiB", "32MiB", "64MiB"} {
		// A subtest each: its daemon and VMs end before the next row's
		// start (run in one test, every earlier row's VMs still looped).
		t.Run(size, func(t *testing.T) { rows = append(rows, handoffPauseRow(t, size)) })
	}
	t.Logf("\n| cpy size | VRAM in use per VM (MiB) | VRAM in each image (MiB) | handoff: SIGUSR2 → new process serving | pause per VM, park → restored (ms) | device model's Bye → Welcome (ms) |\n|---|---|---|---|---|---|\n%s",
		strings.Join(rows, "\n"))
}

// handoffPauseRow runs one restart under four VMs whose cpy moves size.
func handoffPauseRow(t *testing.T, size string) string {
	dir := t.TempDir()
	sock, ctl := dir+"/gpuvm.sock", dir+"/ctl.sock"
	exe := dir + "/gpuvm"
	installGpuvm(t, exe, nil)
	d, logs, _ := startInstalledDaemon(t, exe, handoffConfig(t, dir, sock, ctl), ctl)
	var vms []*loopVM
	for i := range 4 {
		vms = append(vms, startSizedLoopVM(t, sock, fmt.Sprintf("vm%d", i+1), 60+i, 1000, size))
	}
	want, err := parseSize(size)
	if err != nil {
		t.Fatal(err)
	}
	var inUse []string
	for _, vm := range vms {
		// Until its copy buffer is in its VRAM: so much is in use.
		for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
			if v, ok := vgpuNamed(t, ctl, vm.name); ok && v.VRAMInUse >= int64(want) {
				inUse = append(inUse, fmt.Sprintf("%.1f", float64(v.VRAMInUse)/(1<<20)))
				break
			}
			if time.Since(start) > 3*time.Minute {
				t.Fatalf("VM %s never had %s of VRAM in use", vm.name, size)
			}
		}
	}
	sent := time.Now()
	usr2(t, d)
	for !strings.Contains(logs.String(), "serving on the sockets the previous process handed over") {
		if time.Since(sent) > 2*time.Minute {
			t.Fatalf("no new process serves:\n%s", logs)
		}
		time.Sleep(2 * time.Millisecond)
	}
	serving := time.Since(sent)
	var byes []string
	re := regexp.MustCompile(`resumed on the restored vGPU.* pause=(\S+)`)
	for _, vm := range vms {
		for {
			if m := re.FindStringSubmatch(vm.logs.String()); m != nil {
				byes = append(byes, strings.TrimSuffix(m[1], "ms"))
				break
			}
			select {
			case err := <-vm.exited:
				t.Fatalf("VM %s ended without resuming: %v\n%s", vm.name, err, vm.logs.String())
			case <-time.After(10 * time.Millisecond):
			}
			if time.Since(sent) > 2*time.Minute {
				t.Fatalf("VM %s did not resume:\n%s", vm.name, vm.logs.String())
			}
		}
	}
	parked := logTimes(t, logs.String(), `msg="vGPU evicted".* name=(\S+) .*reason="handing it`)
	restored := logTimes(t, logs.String(), `msg="vGPU restored from a state image".* name=(\S+) mode`)
	var pauses, mib []string
	for _, vm := range vms {
		p, r := parked[vm.name], restored[vm.name]
		if p.IsZero() || r.IsZero() {
			t.Fatalf("%s: no park or restore in the log:\n%s", vm.name, logs)
		}
		pauses = append(pauses, strconv.FormatInt(r.Sub(p).Milliseconds(), 10))
	}
	for _, m := range regexp.MustCompile(`msg="vGPU handed off".* bytes=(\d+)`).FindAllStringSubmatch(logs.String(), -1) {
		n, _ := strconv.ParseUint(m[1], 10, 64)
		mib = append(mib, fmt.Sprintf("%.1f", float64(n)/(1<<20)))
	}
	slices.Sort(mib)
	return fmt.Sprintf("| %s | %s | %s | %d ms | %s | %s |", size, strings.Join(inUse, ", "), strings.Join(mib, ", "), serving.Milliseconds(),
		strings.Join(pauses, ", "), strings.Join(byes, ", "))
}

// logTimes maps the name each line matching re captures to its time.
func logTimes(t *testing.T, log, re string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	rx := regexp.MustCompile(`time=(\S+) .*` + re)
	for _, m := range rx.FindAllStringSubmatch(log, -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatal(err)
		}
		out[m[2]] = at
	}
	return out
}
