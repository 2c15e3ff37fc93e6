package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// streamClient is controlClient without an overall timeout: an image is
// as large as the VRAM in use. The command's context bounds it.
func streamClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
}

// vgpuSaveCommand is gpuvm vgpu save ID FILE.
func vgpuSaveCommand(ctl cli.Flag) *cli.Command {
	return &cli.Command{Name: "save", Usage: "save a vGPU's state to an image file; the vGPU is destroyed once the image is on disk", ArgsUsage: "ID FILE",
		Description: "Parks vGPU ID at a submission boundary (as gpuvm vgpu evict does: its work in flight\n" +
			"ends, its channels stop with their state saved, its VRAM in use is copied off the board)\n" +
			"and writes its state image (docs/protocol.md §13) to FILE: registers, channels, PV tables,\n" +
			"scheduler account and VRAM pages, with a SHA-256 checksum. The image is checked as it\n" +
			"arrives; once it is whole and on disk the save is committed: the vGPU is destroyed, its\n" +
			"device model told it was saved, and the image renamed to FILE. Until then the guest is\n" +
			"paused; a save that fails before (a short stream, a full disk) is aborted and the vGPU\n" +
			"resumes on the daemon, with no FILE left. With --keep it stays parked and its guest's\n" +
			"next access resumes it here. A pvdrm vGPU's image holds its back end's files, GEM objects,\n" +
			"channels and pooled buffers too; its front end resumes over the local transport (one on\n" +
			"Xen's transport is refused: its device stays with this daemon, which a handoff moves).\n" +
			"gpuvm vgpu restore gives the image to this or another daemon.\n\n" +
			"Exit status: 0 once FILE holds the image; 1 if there is no such vGPU, it cannot be\n" +
			"saved, or the image could not be stored (the vGPU then resumes); 2 for bad arguments.",
		Flags: []cli.Flag{ctl, &cli.BoolFlag{Name: "keep", Usage: "leave the vGPU parked instead of destroying it"}},
		Action: func(c *cli.Context) error {
			args := positional(c)
			if len(args) != 2 {
				return usageHint(c, "want a vGPU id and a file (gpuvm vgpu save ID FILE), got %d arguments", len(args))
			}
			if _, err := strconv.Atoi(args[0]); err != nil {
				return usageHint(c, "vGPU id %q: not a number (gpuvm vgpu list shows them)", args[0])
			}
			url := "http://aggregator/v1/vgpus/" + args[0] + "/save"
			if c.Bool("keep") {
				url += "?keep=1"
			}
			return saveImage(c, url, args[1], c.Bool("keep"))
		}}
}

// saveImage streams the image at url into file, checking it as it
// arrives. The daemon holds the vGPU parked meanwhile; only once the image
// is whole and on disk (fsync) is the save committed — the vGPU destroyed
// — and then renamed into place. A save that fails before is aborted: the
// vGPU resumes on the daemon, and no file is left. keep: no commit (the
// vGPU stays parked either way).
func saveImage(c *cli.Context, url, file string, keep bool) error {
	client := streamClient(c.Path("control-socket"))
	req, err := http.NewRequestWithContext(c.Context, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: exitFailure, err: controlRefusal(resp)}
	}
	token := resp.Header.Get(aggregator.SaveTokenHeader)
	if !keep && token == "" {
		return &exitError{code: exitFailure, err: errors.New("the daemon sent no save token: it cannot be committed (is it an older gpuvm?); the vGPU stays parked")}
	}
	// end commits the save or aborts it.
	end := func(verb string) error {
		u := url[:strings.IndexByte(url+"?", '?')] + "/" + verb + "?token=" + token
		req, err := http.NewRequestWithContext(context.WithoutCancel(c.Context), http.MethodPost, u, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("control API: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return controlRefusal(resp)
		}
		return nil
	}
	fail := func(err error) error {
		if !keep {
			if aerr := end("abort"); aerr != nil {
				err = fmt.Errorf("%w (and the abort: %v; the daemon lets it resume after %v)", err, aerr, aggregator.SaveCommitTimeout)
			}
		}
		return &exitError{code: exitFailure, err: err}
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return fail(fmt.Errorf("%w (the vGPU resumes on the daemon)", err))
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	img, derr := vgpuimage.Decode(io.TeeReader(resp.Body, tmp))
	if derr == nil {
		defer img.Scrub()
		derr = tmp.Sync()
	}
	if cerr := tmp.Close(); derr == nil {
		derr = cerr
	}
	if derr != nil {
		return fail(fmt.Errorf("the image did not arrive whole or could not be stored, so the save is aborted and the vGPU resumes on the daemon: %w", derr))
	}
	if !keep {
		if err := end("commit"); err != nil {
			return &exitError{code: exitFailure, err: fmt.Errorf("commit: %w (no image was kept)", err)}
		}
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		// Committed: this copy is the vGPU's state now. Keep it where it is.
		kept := tmp.Name() + ".saved"
		if lerr := os.Link(tmp.Name(), kept); lerr == nil {
			return &exitError{code: exitFailure, err: fmt.Errorf("the vGPU is saved, but %v: its image is at %s", err, kept)}
		}
		return &exitError{code: exitFailure, err: err}
	}
	if d, err := os.Open(filepath.Dir(file)); err == nil {
		_ = d.Sync() // the rename on disk too
		d.Close()
	}
	fmt.Fprintf(c.App.Writer, "saved vGPU of %s (mode %s, %d bytes of VRAM) to %s\n", img.Identity.Name, img.Identity.Mode, img.Bytes(), file)
	return nil
}

// vgpuRestoreCommand is gpuvm vgpu restore --domid N FILE.
func vgpuRestoreCommand(ctl cli.Flag) *cli.Command {
	return &cli.Command{Name: "restore", Usage: "give a saved vGPU image to the daemon for a domain's next device model", ArgsUsage: "--domid N FILE",
		Description: "Sends the image in FILE (written by gpuvm vgpu save, here or on another host) to the\n" +
			"daemon, which checks all of it — structure, bounds, checksum, its mode and slot sizes,\n" +
			"the registers it carries — and holds it for domain N (for 10 minutes). The next device\n" +
			"model that connects for domain N, in the image's mode and with at least its RAM, gets\n" +
			"the vGPU back: restored into a slot before it is welcomed, every channel instance and\n" +
			"page-table entry checked against the new slot as the guest's own writes are. A restore\n" +
			"that fails there refuses the device model with the reason and leaves nothing attached.\n\n" +
			"Exit status: 0 once the image waits for its domain; 1 if the daemon refused it (the\n" +
			"reason is printed); 2 for bad arguments.",
		Flags: []cli.Flag{ctl, &cli.UintFlag{Name: "domid", Usage: "the domain whose device model takes the vGPU"}},
		Action: func(c *cli.Context) error {
			args := positional(c)
			if len(args) != 1 {
				return usageHint(c, "want one image file (gpuvm vgpu restore --domid N FILE), got %d arguments", len(args))
			}
			if c.Uint("domid") == 0 {
				return usageHint(c, "name the domain that takes the vGPU: --domid N")
			}
			return restoreImage(c.Context, c.Path("control-socket"), uint32(c.Uint("domid")), args[0], c.App.Writer)
		}}
}

// restoreImage gives the image in file to the daemon for domain domid and
// copies its answer (what waits) to out.
func restoreImage(ctx context.Context, socket string, domid uint32, file string, out io.Writer) error {
	f, err := os.Open(file)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	defer f.Close()
	url := fmt.Sprintf("http://aggregator/v1/domains/%d/restore", domid)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, f)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := streamClient(socket).Do(req)
	if err != nil {
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return &exitError{code: exitFailure, err: controlRefusal(resp)}
	}
	_, err = io.Copy(out, resp.Body)
	return err
}

// controlRefusal is the error of a control API answer that is not a
// success: its status and the reason its JSON body gives (the image
// decoder's, for a refused image), so that it reaches stderr.
func controlRefusal(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return fmt.Errorf("control API: %s: %s", resp.Status, e.Error)
	}
	if msg := strings.TrimSpace(string(body)); msg != "" {
		return fmt.Errorf("control API: %s: %s", resp.Status, msg)
	}
	return fmt.Errorf("control API: %s", resp.Status)
}
