package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/config"
)

// controlClient talks HTTP to the control socket.
func controlClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
}

func vgpuCommand() *cli.Command {
	ctl := &cli.PathFlag{Name: "control-socket", Value: config.Default().Daemon.ControlSocket, Usage: "the aggregator's control socket"}
	// call asks the control API; with needID the vGPU's id follows path,
	// and then suffix.
	call := func(method, path string, needID bool, suffix ...string) cli.ActionFunc {
		return func(c *cli.Context) error {
			url := "http://aggregator" + path
			if needID {
				args := positional(c)
				if len(args) != 1 {
					return usageHint(c, "want one vGPU id (gpuvm vgpu list shows them), got %d arguments", len(args))
				}
				url += "/" + args[0]
			}
			for _, s := range suffix {
				url += s
			}
			if method == http.MethodPost && len(suffix) > 0 && suffix[0] == "/move" {
				if c.String("to") == "" {
					return usageHint(c, "name the board to move it to: --to BOARD (gpuvm board list shows them)")
				}
				url += "?to=" + neturl.QueryEscape(c.String("to"))
			}
			req, err := http.NewRequestWithContext(c.Context, method, url, nil)
			if err != nil {
				return err
			}
			resp, err := controlClient(c.Path("control-socket")).Do(req)
			if err != nil {
				return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
			}
			defer resp.Body.Close()
			if _, err := io.Copy(c.App.Writer, resp.Body); err != nil {
				return err
			}
			if resp.StatusCode >= 300 {
				return &exitError{code: exitFailure, err: fmt.Errorf("control API: %s", resp.Status)}
			}
			return nil
		}
	}
	return &cli.Command{
		Name:  "vgpu",
		Usage: "list, inspect, reset, move, evict or destroy the aggregator's vGPUs; list the vGPU profiles",
		Subcommands: []*cli.Command{
			{Name: "list", Usage: "every vGPU with its counters (JSON)", Flags: []cli.Flag{ctl}, Action: call(http.MethodGet, "/v1/vgpus", false)},
			{Name: "stats", Usage: "one vGPU's counters (JSON)", ArgsUsage: "ID", Flags: []cli.Flag{ctl}, Action: call(http.MethodGet, "/v1/vgpus", true)},
			{Name: "destroy", Usage: "tear a vGPU down; its VM loses the GPU", ArgsUsage: "ID", Flags: []cli.Flag{ctl}, Action: call(http.MethodDelete, "/v1/vgpus", true)},
			{Name: "reset", Usage: "reset a vGPU in place; its VM keeps the GPU and re-initialises it", ArgsUsage: "ID",
				Description: "Resets vGPU ID as a function-level reset of its virtual PCI device would: its channels\n" +
					"stop (work in flight is lost), its VRAM is scrubbed (the whole slot) and its registers\n" +
					"return to their power-on values. It keeps its slot, its id and its VM's connection: the\n" +
					"guest driver sees the GPU reset and re-initialises it. A guest starts the same reset\n" +
					"itself by the FLR bit of the device's PCI Express capability.\n\n" +
					"Exit status: 0 once the vGPU is reset; 1 if there is no such vGPU, it cannot be reset\n" +
					"in place (pvdrm), or a channel would not stop (the vGPU is then destroyed and its slot\n" +
					"taken out of service, as a failed teardown); 2 for bad arguments.",
				Flags: []cli.Flag{ctl}, Action: call(http.MethodPost, "/v1/vgpus", true, "/reset")},
			{Name: "move", Usage: "move a running vGPU to a free slot of another board (or of its own)", ArgsUsage: "ID --to BOARD",
				Description: "Moves vGPU ID while its VM runs: its work in flight ends (a submission boundary), its\n" +
					"channels stop with their state saved, the VRAM it uses is copied to a free slot of BOARD,\n" +
					"its shadows are rebuilt there and its channels go on where they stopped. The guest sees a\n" +
					"pause, never an error; its id stays. The slot it left is scrubbed and freed. Fully\n" +
					"virtualized modes only (PV and pvdrm vGPUs are refused); a BAR-remap vGPU's device model\n" +
					"is handed the new slice. A parked (evicted) vGPU is restored on BOARD. Prints from/to\n" +
					"board and slot, the bytes copied and the pause.\n\n" +
					"Exit status: 0 once the vGPU runs on BOARD; 1 if there is no such vGPU or board, BOARD is\n" +
					"full, cordoned or failed, the vGPU cannot be moved, or the move failed (the vGPU is then\n" +
					"destroyed); 2 for bad arguments.",
				Flags:  []cli.Flag{ctl, &cli.StringFlag{Name: "to", Usage: "the board to move it to"}},
				Action: call(http.MethodPost, "/v1/vgpus", true, "/move")},
			{Name: "evict", Usage: "park a vGPU: free its slot, keep its state until its VM's next access", ArgsUsage: "ID",
				Description: "Evicts vGPU ID as an overcommitted board does to free a slot: its work in flight ends,\n" +
					"its channels stop with their state saved, the VRAM it uses is copied to the daemon's\n" +
					"memory and its slot is scrubbed and freed. Its VM keeps the GPU: the guest's next\n" +
					"access restores it into a free slot (it waits, never errs). Fully virtualized modes\n" +
					"only. Prints the bytes copied and the pause.\n\n" +
					"Exit status: 0 once the vGPU is parked; 1 if there is no such vGPU, it cannot be\n" +
					"evicted, or the eviction failed (the vGPU is then destroyed); 2 for bad arguments.",
				Flags: []cli.Flag{ctl}, Action: call(http.MethodPost, "/v1/vgpus", true, "/evict")},
			vgpuSaveCommand(ctl),           // vgpusave.go
			vgpuRestoreCommand(ctl),        // vgpusave.go
			vgpuMigrateCommand(ctl),        // vgpumigrate.go
			vgpuMigrateReceiveCommand(ctl), // vgpumigrate.go
			{Name: "layout", Usage: "how the board is partitioned (JSON)", Flags: []cli.Flag{ctl}, Action: call(http.MethodGet, "/v1/layout", false)},
			vgpuTypesCommand(ctl),
		},
	}
}
