// Command gpuvm is the GPU virtualization back end for Xen: the GPU Access
// Aggregator daemon, the per-VM device model, vGPU management, and the
// benchmark harnesses, in one binary.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

// exitError carries a process exit code through urfave/cli.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1 // a run failed or a result did not verify
	exitUsage       = 2 // bad flags or configuration
	exitInterrupted = 130
)

func usageError(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "gpuvm",
		Usage:   "share one NVIDIA Fermi-class GPU among Xen guests (full, para and pvdrm virtualization)",
		Version: version,
		Description: "gpuvm is a GPU virtualization back end for the Xen hypervisor. A dom0 daemon, the GPU\n" +
			"Access Aggregator, owns the physical GPU (or the embedded simulated board) and gives each\n" +
			"guest a virtual GPU with isolation and fair GPU time.\n\n" +
			"Start here:  gpuvm bench          run the evaluation workloads on the simulated board",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "log level: debug, info, warn, error", EnvVars: []string{"GPUVM_LOG_LEVEL"}},
		},
		Commands: []*cli.Command{
			benchCommand(),
			serveCommand(),
			devmodelCommand(),
			vgpuCommand(),
		},
		ExitErrHandler: func(*cli.Context, error) {}, // main reports errors itself
	}
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, usageError("--log-level: %v", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), nil
}

func main() { os.Exit(run(os.Args)) }

// run is main without the exit, so tests can re-execute the test binary as
// gpuvm (see selfCommand).
func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := newApp().RunContext(ctx, args)
	return exitCode(ctx, err)
}

// reexecEnv marks a process started by selfCommand (a test binary seeing it
// runs gpuvm's main instead of its tests).
const reexecEnv = "GPUVM_REEXEC"

// selfCommand runs this binary again with args (the bench's VM processes).
func selfCommand(ctx context.Context, args []string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), reexecEnv+"=1")
	return cmd
}

func exitCode(ctx context.Context, err error) int {
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(os.Stderr, "gpuvm:", err)
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case ctx.Err() != nil:
		return exitInterrupted
	}
	return exitFailure
}
