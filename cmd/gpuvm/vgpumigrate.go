package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Live migration from the command line (docs/protocol.md §14): gpuvm vgpu
// migrate carries the source daemon's stream to the destination — its
// control socket, or a command such as ssh running gpuvm vgpu
// migrate-receive there — and gives the source the destination's answer,
// as xl migrate does with its ssh pipe.

// migrateAnswer opens the receiver's one-line answer on stdout.
const (
	migrateOK    = "ok "
	migrateError = "error "
)

// vgpuMigrateCommand is gpuvm vgpu migrate ID.
func vgpuMigrateCommand(ctl cli.Flag) *cli.Command {
	return &cli.Command{Name: "migrate", Usage: "live-migrate a vGPU to another daemon while its guest runs", ArgsUsage: "ID (--to-control SOCKET | --ssh COMMAND)",
		Description: "Streams vGPU ID from this daemon to another (docs/protocol.md §14): its VRAM pages in use\n" +
			"are sent in rounds while the guest runs — each round re-reads every page and re-sends\n" +
			"those whose content changed, whoever wrote them (a Fermi keeps no dirty bits) — then the\n" +
			"vGPU is parked at a submission boundary and the pages changed since, its registers,\n" +
			"channels, PV tables and account follow. The destination checks all of it as it checks a\n" +
			"restored image and holds it for the domain; only on its ok is the vGPU destroyed here,\n" +
			"its device model told to resume on the destination. On any failure the vGPU stays here\n" +
			"(its guest's next access resumes it). A pvdrm vGPU's back end stops between two requests\n" +
			"for the stop, and its VRAM objects, files and buffers follow; its front end must be on\n" +
			"the local transport.\n\n" +
			"The destination is a daemon's control socket on this host (--to-control), or COMMAND\n" +
			"run by sh -c with \" --domid N\" appended (--ssh 'ssh host gpuvm vgpu migrate-receive'):\n" +
			"the stream goes to its stdin and it answers one line on stdout. Prints the migration's\n" +
			"rounds, downtime and bytes as JSON.\n\n" +
			"Exit status: 0 once the vGPU runs from the destination's image; 1 if there is no such\n" +
			"vGPU, it cannot be migrated, or the migration failed (the vGPU then stays here); 2 for\n" +
			"bad arguments.",
		Flags: []cli.Flag{ctl,
			&cli.PathFlag{Name: "to-control", Usage: "the destination daemon's control socket"},
			&cli.StringFlag{Name: "ssh", Usage: "a command that runs gpuvm vgpu migrate-receive on the destination, e.g. 'ssh host gpuvm vgpu migrate-receive'"},
			&cli.UintFlag{Name: "domid", Usage: "the domain whose device model takes it on the destination (default: the vGPU's)"},
			&cli.IntFlag{Name: "rounds", Usage: "pre-copy rounds after the first, at most (default 8; -1: none, a plain stop-and-copy)"},
			&cli.Uint64Flag{Name: "target", Usage: "bytes a round may send and the pre-copy be done (default 2 MiB)"},
		},
		Action: func(c *cli.Context) error {
			args := positional(c)
			if len(args) != 1 {
				return usageHint(c, "want one vGPU id (gpuvm vgpu migrate ID --to-control SOCKET), got %d arguments", len(args))
			}
			if _, err := strconv.Atoi(args[0]); err != nil {
				return usageHint(c, "vGPU id %q: not a number (gpuvm vgpu list shows them)", args[0])
			}
			if (c.Path("to-control") == "") == (c.String("ssh") == "") {
				return usageHint(c, "name the destination: --to-control SOCKET or --ssh COMMAND, one of them")
			}
			return migrate(c, args[0])
		}}
}

func migrate(c *cli.Context, id string) error {
	src := c.Path("control-socket")
	domid := c.Uint("domid")
	if domid == 0 {
		var info aggregator.VGPUInfo
		if err := controlGet(c.Context, src, "/v1/vgpus/"+id, &info); err != nil {
			return &exitError{code: exitFailure, err: err}
		}
		domid = uint(info.DomID)
	}
	url := fmt.Sprintf("http://aggregator/v1/vgpus/%s/migrate?rounds=%d&target=%d", id, c.Int("rounds"), c.Uint64("target"))
	req, err := http.NewRequestWithContext(c.Context, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := streamClient(src).Do(req)
	if err != nil {
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: exitFailure, err: controlRefusal(resp)}
	}
	token := resp.Header.Get(aggregator.MigrationTokenHeader)
	var answer string
	var derr error
	var finish func(commit bool) error
	if sock := c.Path("to-control"); sock != "" {
		answer, derr = migrateToControl(c.Context, sock, uint32(domid), resp.Body)
		finish = func(commit bool) error {
			if commit {
				return nil
			}
			return forgetMigration(c.Context, sock, uint32(domid))
		}
	} else {
		answer, finish, derr = migrateThrough(c.Context, c.String("ssh"), uint32(domid), resp.Body)
	}
	verdict := aggregator.MigrateVerdict{OK: derr == nil}
	if derr != nil {
		// The source may still be sending rounds: cut its stream so that
		// it stops and keeps the vGPU, whatever becomes of the verdict.
		resp.Body.Close()
		verdict.Error = derr.Error()
	}
	stats, refused, verr := sendVerdict(c.Context, src, id, token, verdict)
	switch {
	case derr != nil:
		return &exitError{code: exitFailure, err: fmt.Errorf("migration of vGPU %s: %w (the vGPU stays on the source)", id, derr)}
	case refused:
		// The source kept the vGPU: the image waiting on the destination
		// is stale from now on, and must not be resumed from later.
		ferr := finish(false)
		return &exitError{code: exitFailure, err: errors.Join(fmt.Errorf("migration of vGPU %s: the source kept it: %w", id, verr), ferr)}
	case verr != nil:
		// Whether the source let it go is not known: the image stays on
		// the destination, where the device model would resume.
		_ = finish(true)
		return &exitError{code: exitFailure, err: fmt.Errorf("migration of vGPU %s: the destination holds it (%s); the source's answer was lost: %w (gpuvm vgpu list on both says where it is)", id, answer, verr)}
	}
	if err := finish(true); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	_, err = c.App.Writer.Write(stats)
	return err
}

// forgetMigration drops the image a migration left waiting for domid at
// the daemon at sock.
func forgetMigration(ctx context.Context, sock string, domid uint32) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, fmt.Sprintf("http://aggregator/v1/domains/%d/migrate-in", domid), nil)
	if err != nil {
		return err
	}
	resp, err := streamClient(sock).Do(req)
	if err != nil {
		return fmt.Errorf("dropping the destination's image: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("dropping the destination's image: %w", controlRefusal(resp))
	}
	return nil
}

// migrateToControl relays the stream to the daemon at sock for domid and
// returns its answer.
func migrateToControl(ctx context.Context, sock string, domid uint32, stream io.Reader) (string, error) {
	pr, pw := io.Pipe()
	go func() {
		_, err := vgpuimage.CopyStream(pw, stream)
		pw.CloseWithError(err)
	}()
	url := fmt.Sprintf("http://aggregator/v1/domains/%d/migrate-in", domid)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, pr)
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := streamClient(sock).Do(req)
	if err != nil {
		pr.CloseWithError(err)
		return "", fmt.Errorf("destination: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("destination: %w", controlRefusal(resp))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return strings.TrimSpace(string(body)), err
}

// migrateThrough runs command (sh -c, with " --domid N" appended), writes
// the stream to its stdin and reads its one-line answer. finish then
// tells it, on its stdin, whether the source let the vGPU go ("commit")
// or kept it ("abort": it drops the image), and waits for it to end.
func migrateThrough(ctx context.Context, command string, domid uint32, stream io.Reader) (string, func(commit bool) error, error) {
	ctx, cancel := context.WithTimeout(ctx, aggregator.MigrateInTimeout)
	cmd := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("%s --domid %d", command, domid))
	in, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return "", nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return "", nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return "", nil, fmt.Errorf("destination command: %w", err)
	}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(io.LimitReader(out, 64<<10)).ReadString('\n')
		lines <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	_, cerr := vgpuimage.CopyStream(in, stream)
	line := <-lines
	finish := func(commit bool) error {
		defer cancel()
		word := "abort\n"
		if commit {
			word = "commit\n"
		}
		_, _ = io.WriteString(in, word)
		in.Close()
		if err := cmd.Wait(); err != nil && !commit {
			return fmt.Errorf("destination command: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return nil
	}
	ok, bad := strings.TrimSpace(migrateOK), strings.TrimSpace(migrateError)
	switch {
	case strings.HasPrefix(line, ok) && cerr == nil:
		return strings.TrimSpace(strings.TrimPrefix(line, ok)), finish, nil
	case strings.HasPrefix(line, bad):
		_ = finish(false)
		return "", nil, fmt.Errorf("the destination command answered: %s", strings.TrimSpace(strings.TrimPrefix(line, bad)))
	}
	_ = finish(false)
	return "", nil, fmt.Errorf("destination command: answer %q, stream %v: %s", line, cerr, strings.TrimSpace(stderr.String()))
}

// sendVerdict gives the source the destination's answer and returns the
// migration's statistics; refused says the source answered that the
// migration did not complete (it kept the vGPU).
func sendVerdict(ctx context.Context, sock, id, token string, v aggregator.MigrateVerdict) (stats []byte, refused bool, err error) {
	body, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(ctx, aggregator.MigrateVerdictWait)
	defer cancel()
	url := fmt.Sprintf("http://aggregator/v1/vgpus/%s/migrate-verdict?token=%s", id, token)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := streamClient(sock).Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("control API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusNotFound, controlRefusal(resp)
	}
	stats, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return stats, false, err
}

// vgpuMigrateReceiveCommand is gpuvm vgpu migrate-receive --domid N.
func vgpuMigrateReceiveCommand(ctl cli.Flag) *cli.Command {
	return &cli.Command{Name: "migrate-receive", Usage: "receive a live migration's stream on stdin for a domain (run by gpuvm vgpu migrate --ssh)", ArgsUsage: "--domid N",
		Description: "Reads one migration stream (docs/protocol.md §14) on stdin, up to its end record, and\n" +
			"gives it to this host's daemon, which checks all of it as it checks a restored image and\n" +
			"holds the vGPU for domain N's next device model. Answers one line on stdout: \"ok\" and\n" +
			"the daemon's JSON, or \"error\" and the reason; the sender destroys its vGPU only on ok.\n" +
			"After an ok it reads one more line: \"abort\" (the source kept the vGPU) drops the image;\n" +
			"\"commit\" or the end of stdin leaves it for the domain's device model.\n\n" +
			"Exit status: 0 on ok; 1 if the stream was refused; 2 for bad arguments.",
		Flags: []cli.Flag{ctl, &cli.UintFlag{Name: "domid", Usage: "the domain whose device model takes the vGPU"}},
		Action: func(c *cli.Context) error {
			if len(positional(c)) != 0 {
				return usageHint(c, "takes no arguments: the stream comes on stdin")
			}
			if c.Uint("domid") == 0 {
				return usageHint(c, "name the domain that takes the vGPU: --domid N")
			}
			answer, err := migrateToControl(c.Context, c.Path("control-socket"), uint32(c.Uint("domid")), os.Stdin)
			if err != nil {
				fmt.Fprintf(c.App.Writer, "%s%s\n", migrateError, strings.ReplaceAll(err.Error(), "\n", " "))
				return &exitError{code: exitFailure, err: err}
			}
			fmt.Fprintf(c.App.Writer, "%s%s\n", migrateOK, strings.Join(strings.Fields(answer), " "))
			// The sender says whether the source let the vGPU go. Only an
			// explicit abort drops the image: a sender gone silent may
			// have let it go already.
			word, _ := bufio.NewReader(io.LimitReader(os.Stdin, 64)).ReadString('\n')
			if strings.TrimSpace(word) == "abort" {
				return forgetMigration(c.Context, c.Path("control-socket"), uint32(c.Uint("domid")))
			}
			return nil
		}}
}
