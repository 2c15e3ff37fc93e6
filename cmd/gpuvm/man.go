package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/config"
)

// manCommand is the hidden `gpuvm man`: the manual page, generated from this
// binary's own commands and flags, as roff on stdout. Packaging installs its
// output as gpuvm(1) (scripts/build-deb, scripts/install), so the page never
// drifts from the CLI.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:   "man",
		Usage:  "print the manual page (roff) to stdout",
		Hidden: true,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "section", Value: 1, Usage: "manual section the page is written for, 1..9"},
		},
		Action: func(c *cli.Context) error {
			section := c.Int("section")
			if section < 1 || section > 9 {
				return usageHint(c, "--section %d: want 1..9", section)
			}
			return writeMan(c.App.Writer, c.App, section)
		},
	}
}

// systemSocketDir is the daemon's socket directory when it runs as root,
// as a system service does (config.DefaultSocketDir).
const systemSocketDir = "/run/gpuvm"

// manFiles is appended to the generated page: what the command-line help
// cannot say (where things are, exit codes).
const manFiles = `
.SH EXIT STATUS
0 success (every result verified); 1 a run failed or did not verify; 2 a usage
or configuration error (one line saying what, and where its help is;
configuration errors as file:line:col: key: message); 130 interrupted by
SIGINT or SIGTERM before it finished
.RB ( "gpuvm serve"
exits 0 when stopped that way).

.SH FILES
.TP
.I /etc/gpuvm/gpuvm.toml
configuration of the gpuvm.service daemon
.RB ( "gpuvm serve \-\-config" ).
Every key is optional; the example that documents every key is installed as
.IR /usr/share/doc/gpuvm/examples/gpuvm.toml .
.TP
.I /etc/default/gpuvm
GPUVM_SERVE_ARGS: extra arguments of
.B gpuvm serve
in gpuvm.service (e.g.
.B \-\-xen
in a Xen dom0).
.TP
.I /run/gpuvm/gpuvm.sock
the daemon's device-model socket, and
.I /run/gpuvm/control.sock
its control socket
.RB ( "gpuvm vgpu" ),
when it runs as root. The socket defaults shown above are root's; for any
other user they are in
.IR $XDG_RUNTIME_DIR/gpuvm ,
or
.I /tmp/gpuvm\-UID
without XDG_RUNTIME_DIR.

.SH SIGNALS
SIGINT or SIGTERM stop
.B gpuvm serve
cleanly: every vGPU is torn down and every VRAM slice scrubbed.
`

// writeMan renders app's manual page for section as roff to w. The page is
// the same whoever generates it: socket defaults are shown as root's.
func writeMan(w io.Writer, app *cli.App, section int) error {
	// urfave/cli's help command is one package-level value that its setup
	// appends to every command's subcommands — its own too, once help for
	// help was shown — so a process that ran the CLI before can hold a
	// cycle. The page documents our commands, without help.
	page := *app
	page.Commands = withoutHelp(app.Commands)
	return writeManPage(w, &page, section)
}

// withoutHelp returns copies of cmds, and of their subcommands, without
// urfave/cli's help commands.
func withoutHelp(cmds []*cli.Command) []*cli.Command {
	var out []*cli.Command
	for _, c := range cmds {
		if c.Name == "help" {
			continue
		}
		cp := *c
		cp.Subcommands = withoutHelp(c.Subcommands)
		out = append(out, &cp)
	}
	return out
}

func writeManPage(w io.Writer, app *cli.App, section int) error {
	page, err := app.ToManWithSection(section)
	if err != nil {
		return fmt.Errorf("man page: %w", err)
	}
	if dir := config.DefaultSocketDir(); dir != systemSocketDir {
		page = strings.ReplaceAll(page, `"`+dir+`/`, `"`+systemSocketDir+`/`)
	}
	// ToMan's title line names neither the version nor the manual.
	th := fmt.Sprintf(".TH %s %d\n", app.Name, section)
	page = strings.Replace(page, th, fmt.Sprintf(".TH %s %d \"\" \"%s %s\" \"%s manual\"\n",
		strings.ToUpper(app.Name), section, app.Name, app.Version, app.Name), 1)
	if _, err := io.WriteString(w, page+manFiles); err != nil {
		return fmt.Errorf("man page: %w", err)
	}
	return nil
}
