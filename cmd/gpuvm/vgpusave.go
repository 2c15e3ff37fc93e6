package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

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
	return &cli.Command{Name: "save", Usage: "save a vGPU's state to an image file; the vGPU is destroyed once it is written", ArgsUsage: "ID FILE",
		Description: "Parks vGPU ID at a submission boundary (as gpuvm vgpu evict does: its work in flight\n" +
			"ends, its channels stop with their state saved, its VRAM in use is copied off the board)\n" +
			"and writes its state image (docs/protocol.md §13) to FILE: registers, channels, PV tables,\n" +
			"scheduler account and VRAM pages, with a SHA-256 checksum. Once the image is written the\n" +
			"vGPU is destroyed and its device model is told it was saved; with --keep it stays parked\n" +
			"and its guest's next access resumes it here. The image is checked as it arrives and only\n" +
			"a complete one is left at FILE. pvdrm vGPUs cannot be saved. gpuvm vgpu restore gives\n" +
			"the image to this or another daemon.\n\n" +
			"Exit status: 0 once FILE holds the image; 1 if there is no such vGPU, it cannot be\n" +
			"saved, or the image could not be written (the vGPU then stays parked); 2 for bad arguments.",
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
			return saveImage(c, url, args[1])
		}}
}

// saveImage streams the image at url into file, checking it as it
// arrives; only a complete, valid image is renamed into place.
func saveImage(c *cli.Context, url, file string) error {
	req, err := http.NewRequestWithContext(c.Context, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := streamClient(c.Path("control-socket")).Do(req)
	if err != nil {
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: exitFailure, err: controlRefusal(resp)}
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	img, derr := vgpuimage.Decode(io.TeeReader(resp.Body, tmp))
	cerr := tmp.Close()
	if derr != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("the image did not arrive whole (the vGPU stays parked on the daemon): %w", derr)}
	}
	defer img.Scrub()
	if cerr != nil {
		return &exitError{code: exitFailure, err: cerr}
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return &exitError{code: exitFailure, err: err}
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
			f, err := os.Open(args[0])
			if err != nil {
				return &exitError{code: exitFailure, err: err}
			}
			defer f.Close()
			url := fmt.Sprintf("http://aggregator/v1/domains/%d/restore", c.Uint("domid"))
			req, err := http.NewRequestWithContext(c.Context, http.MethodPost, url, f)
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/octet-stream")
			resp, err := streamClient(c.Path("control-socket")).Do(req)
			if err != nil {
				return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
			}
			defer resp.Body.Close()
			if resp.StatusCode >= 300 {
				return &exitError{code: exitFailure, err: controlRefusal(resp)}
			}
			if _, err := io.Copy(c.App.Writer, resp.Body); err != nil {
				return err
			}
			return nil
		}}
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
