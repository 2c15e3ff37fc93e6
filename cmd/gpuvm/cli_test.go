package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
)

// TestUsageErrorsExit2: unknown flags and commands, stray or missing
// arguments and bad values are usage errors: exit status 2 (as the README
// says), one line naming the problem and where the help is, and no help
// text dumped.
func TestUsageErrorsExit2(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // in the one-line error
	}{
		{[]string{"--bogus"}, "flag provided but not defined: -bogus (see 'gpuvm --help')"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"help", "frob"}, "No help topic for 'frob'"},
		{[]string{"bench", "--nope"}, "(see 'gpuvm bench --help')"},
		{[]string{"bench", "frob"}, `unknown command "frob" (commands: fairness, covert, scale, report, slo, mobility, hetero)`},
		{[]string{"bench", "report", "--out", "x", "extra"}, `report takes no arguments (got "extra")`},
		{[]string{"bench", "report", "--out", "x", "--runs", "0"}, "--runs 0: want 1..1000"},
		{[]string{"serve", "now"}, `unexpected argument "now" (see 'gpuvm serve --help')`},
		{[]string{"devmodel", "--mode"}, "flag needs an argument: -mode"},
		{[]string{"vgpu", "frob"}, `unknown command "frob" (commands: list, stats, destroy, reset, move, evict, save, restore, migrate, migrate-receive, layout, types)`},
		{[]string{"vgpu", "save", "1"}, "want a vGPU id and a file"},
		{[]string{"vgpu", "save", "x", "f"}, `vGPU id "x": not a number`},
		{[]string{"vgpu", "restore", "f"}, "name the domain that takes the vGPU: --domid N"},
		{[]string{"vgpu", "restore", "--domid", "3"}, "want one image file"},
		{[]string{"vgpu", "stats"}, "want one vGPU id"},
		{[]string{"vgpu", "destroy", "1", "2"}, "got 2 arguments"},
		{[]string{"vgpu", "move", "0"}, "name the board to move it to: --to BOARD"},
		{[]string{"vgpu", "stats", "0", "--nope"}, "flag provided but not defined: -nope (see 'gpuvm vgpu stats --help')"},
		{[]string{"vgpu", "stats", "0", "--control-socket"}, "flag needs an argument: -control-socket"},
	} {
		stdout, stderr, err := runApp(t, tt.args...)
		if code := exitCode(context.Background(), err); code != exitUsage {
			t.Errorf("%v: exit %d (%v), want %d", tt.args, code, err, exitUsage)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tt.want) || strings.Contains(msg, "\n") {
			t.Errorf("%v: error %q, want one line containing %q", tt.args, msg, tt.want)
		}
		if strings.Contains(stdout+stderr, "USAGE:") {
			t.Errorf("%v: help dumped:\n%s%s", tt.args, stdout, stderr)
		}
	}
}

// The real process: exit status 2 and one line on stderr.
func TestUsageErrorProcess(t *testing.T) {
	cmd := selfCommand(context.Background(), []string{"devmodel", "--no-such-flag"})
	out, err := cmd.CombinedOutput()
	var xe *exec.ExitError
	if !errors.As(err, &xe) || xe.ExitCode() != exitUsage {
		t.Fatalf("exit: %v, want status %d\n%s", err, exitUsage, out)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "gpuvm: ") {
		t.Errorf("output is not one gpuvm: line:\n%s", out)
	}
}

// TestHelpStillWorks: asking for help is not an error.
func TestHelpStillWorks(t *testing.T) {
	for _, args := range [][]string{{}, {"--help"}, {"vgpu"}, {"vgpu", "stats", "--help"}, {"vgpu", "stats", "0", "--help"}, {"help", "serve"}} {
		stdout, _, err := runApp(t, args...)
		if err != nil || !strings.Contains(stdout, "USAGE:") {
			t.Errorf("%v: err %v, output:\n%s", args, err, stdout)
		}
	}
}

// TestFlagsAfterArguments: `gpuvm vgpu stats 0 --control-socket X` reaches
// the daemon on X, as the flag-first form does.
func TestFlagsAfterArguments(t *testing.T) {
	dir := t.TempDir()
	ctl := dir + "/ctl.sock"
	startDaemon(t, daemonConfig(t, dir, dir+"/a.sock", ctl, ""), ctl)
	for _, args := range [][]string{
		{"vgpu", "stats", "--control-socket", ctl, "5"},
		{"vgpu", "stats", "5", "--control-socket", ctl},
		{"vgpu", "stats", "5", "--control-socket=" + ctl},
		{"--log-level", "error", "vgpu", "destroy", "5", "--control-socket", ctl},
		{"vgpu", "reset", "5", "--control-socket", ctl},
	} {
		stdout, _, err := runApp(t, args...)
		// No vGPU 5: the daemon answers 404, which proves the flag took.
		if !strings.Contains(stdout, "no such vGPU") || err == nil || !strings.Contains(err.Error(), "404") {
			t.Errorf("%v: err %v, output %q; want the daemon's 404", args, err, stdout)
		}
		if code := exitCode(context.Background(), err); code != exitFailure {
			t.Errorf("%v: exit %d, want %d", args, code, exitFailure)
		}
	}
	if _, _, err := runApp(t, "vgpu", "layout", "--control-socket", ctl); err != nil {
		t.Errorf("layout: %v", err)
	}
}

// A failed devmodel run ends with one line naming the first failure.
func TestFirstFailure(t *testing.T) {
	err := firstFailure([]bench.Result{{Workload: "nop", Verified: true},
		{Workload: "mmul", Error: "run 3: memcpy HtoD: device reads all-ones: gone\nclose context: gone (device: ipc: server closed the connection: vGPU 0 destroyed through the control API)"}})
	want := "some results failed or did not verify; mmul: run 3: memcpy HtoD: device reads all-ones: gone; close context: gone (device: ipc: server closed the connection: vGPU 0 destroyed through the control API)"
	if err == nil || err.Error() != want {
		t.Errorf("firstFailure = %v\nwant %s", err, want)
	}
}

// The title and help describe only what exists: the modes this build
// serves, and each kind of mode (traps, hypercalls, the pvdrm split driver).
func TestHelpDescribesWhatExists(t *testing.T) {
	stdout, _, err := runApp(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, built := range []string{"pvdrm", "split driver", "hypercalls"} {
		if !strings.Contains(strings.ToLower(stdout), built) {
			t.Errorf("help does not mention %q:\n%s", built, stdout)
		}
	}
	if !strings.Contains(stdout, "Modes: "+strings.Join(config.ModeNames(), ", ")+".") {
		t.Errorf("help does not list the modes served:\n%s", stdout)
	}
}
