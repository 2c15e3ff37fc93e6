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
	"strings"
	"syscall"

	"github.com/gpuvm/gpuvm/config"
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
	app := &cli.App{
		Name:    "gpuvm",
		Usage:   "share one NVIDIA Fermi-class GPU among VMs by full and para-virtualization (a GPUvm-style back end for Xen)",
		Version: version,
		Description: "gpuvm is a GPU virtualization back end for the Xen hypervisor. A dom0 daemon, the GPU\n" +
			"Access Aggregator (gpuvm serve), owns the embedded simulated Fermi board and gives each\n" +
			"VM a virtual GPU with isolation and fair GPU time; a VM is a device model process (gpuvm\n" +
			"devmodel) whose guest driver's MMIO traps to the aggregator; in the pv- modes the driver\n" +
			"builds its GPU page tables by hypercalls instead; in the pvdrm modes (the split driver)\n" +
			"the guest has no GPU registers and sends whole DRM operations over a shared ring to a\n" +
			"back end in the aggregator.\n" +
			"Modes: " + strings.Join(config.ModeNames(), ", ") + ".\n\n" +
			"Start here:  gpuvm bench          run the evaluation workloads on the simulated board",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "log level: debug, info, warn, error", EnvVars: []string{"GPUVM_LOG_LEVEL"}},
		},
		Commands: []*cli.Command{
			benchCommand(),
			serveCommand(),
			devmodelCommand(),
			vgpuCommand(),
			boardCommand(),
			xlCommand(),
			guestCommand(),
			topCommand(),
			traceCommand(),
			libvirtCommand(),
			manCommand(),
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return unknownCommand(c)
			}
			return cli.ShowAppHelp(c)
		},
		OnUsageError:   onUsageError,
		ExitErrHandler: func(*cli.Context, error) {}, // main reports errors itself
	}
	strictUsage(app.Commands)
	return app
}

// strictUsage makes every command report usage errors the way the README
// promises: exit status 2, one line saying what is wrong and where the help
// is (not the whole help text). It also lets flags follow positional
// arguments (`gpuvm vgpu stats 0 --control-socket X`) and refuses
// arguments a command does not take.
func strictUsage(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = onUsageError
		if c.Action == nil {
			c.Action = unknownCommand
		} else {
			c.Action = withArgs(c.Action, c.ArgsUsage != "")
		}
		strictUsage(c.Subcommands)
	}
}

// commandPath is the command line that names c's command, e.g. "gpuvm vgpu stats".
func commandPath(c *cli.Context) string {
	var names []string
	for _, l := range c.Lineage() {
		if l.Command != nil && l.Command.Name != "" {
			names = append([]string{l.Command.Name}, names...)
		}
	}
	if len(names) == 0 || names[0] != c.App.Name {
		names = append([]string{c.App.Name}, names...)
	}
	return strings.Join(names, " ")
}

// usageHint is a usage error about c's command, with where its help is.
func usageHint(c *cli.Context, format string, args ...any) error {
	return usageError("%s (see '%s --help')", fmt.Sprintf(format, args...), commandPath(c))
}

func onUsageError(c *cli.Context, err error, _ bool) error {
	return usageHint(c, "%v", err)
}

// unknownCommand is the action of the app and of commands that only group
// subcommands: help without arguments, a usage error with one.
func unknownCommand(c *cli.Context) error {
	if c.Args().Present() {
		return usageHint(c, "unknown command %q (commands: %s)", c.Args().First(), strings.Join(subcommands(c), ", "))
	}
	return cli.ShowSubcommandHelp(c)
}

// subcommands names c's command's subcommands (urfave/cli's own help
// command aside).
func subcommands(c *cli.Context) []string {
	var names []string
	for _, sc := range c.Command.Subcommands {
		if !sc.Hidden && sc.Name != "help" {
			names = append(names, sc.Name)
		}
	}
	return names
}

type positionalKey struct{}

// positional returns the command's positional arguments (see withArgs).
func positional(c *cli.Context) []string {
	args, _ := c.Context.Value(positionalKey{}).([]string)
	return args
}

// withArgs wraps a command's action: flags written after positional
// arguments (where the flag package stops parsing) are applied, the
// positional arguments are kept for positional(c), and a command that takes
// none refuses them.
func withArgs(action cli.ActionFunc, takesArgs bool) cli.ActionFunc {
	return func(c *cli.Context) error {
		args, help, err := interleaved(c)
		if err != nil {
			return usageHint(c, "%v", err)
		}
		if help {
			lineage := c.Lineage()
			if len(lineage) > 1 {
				return cli.ShowCommandHelp(lineage[1], c.Command.Name)
			}
			return cli.ShowAppHelp(c)
		}
		if len(args) > 0 && !takesArgs {
			if len(subcommands(c)) > 0 {
				return unknownCommand(c)
			}
			return usageHint(c, "unexpected argument %q", args[0])
		}
		c.Context = context.WithValue(c.Context, positionalKey{}, args)
		return action(c)
	}
}

// interleaved sets the flags among c's remaining arguments and returns the
// others. -h/--help anywhere asks for help.
func interleaved(c *cli.Context) (args []string, help bool, err error) {
	rest := c.Args().Slice()
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			return append(args, rest[i+1:]...), false, nil
		}
		if len(a) < 2 || a[0] != '-' {
			args = append(args, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "h" || name == "help" {
			return nil, true, nil
		}
		f := lookupFlag(c, name)
		if f == nil {
			return nil, false, fmt.Errorf("flag provided but not defined: -%s", name)
		}
		if !hasValue {
			if tv, ok := f.(cli.DocGenerationFlag); ok && !tv.TakesValue() {
				value = "true"
			} else if i+1 < len(rest) {
				i++
				value = rest[i]
			} else {
				return nil, false, fmt.Errorf("flag needs an argument: -%s", name)
			}
		}
		if err := c.Set(name, value); err != nil {
			return nil, false, fmt.Errorf("invalid value %q for flag -%s: %v", value, name, err)
		}
	}
	return args, false, nil
}

// lookupFlag finds a flag by any of its names on c's command or an
// enclosing one.
func lookupFlag(c *cli.Context, name string) cli.Flag {
	for _, l := range c.Lineage() {
		if l.Command == nil {
			continue
		}
		for _, f := range l.Command.Flags {
			for _, n := range f.Names() {
				if n == name {
					return f
				}
			}
		}
	}
	return nil
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

// selfExeEnv names another gpuvm binary for selfCommand to run instead of
// this one: the tests' race-detector builds run their VM processes from a
// plain build (the processes under test are the daemon's, in the test).
const selfExeEnv = "GPUVM_SELF_EXE"

// selfCommand runs this binary again with args (the bench's VM processes),
// or the binary $GPUVM_SELF_EXE names.
func selfCommand(ctx context.Context, args []string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	if p := os.Getenv(selfExeEnv); p != "" {
		exe = p
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
	var ce cli.ExitCoder
	switch {
	case errors.As(err, &ee):
		return ee.code
	case ctx.Err() != nil:
		return exitInterrupted
	case errors.As(err, &ce):
		return exitUsage // urfave/cli's own (`gpuvm help frob`: no help topic)
	}
	return exitFailure
}
