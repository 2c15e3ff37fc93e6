package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
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
	call := func(method, path string, needID bool) cli.ActionFunc {
		return func(c *cli.Context) error {
			url := "http://aggregator" + path
			if needID {
				args := positional(c)
				if len(args) != 1 {
					return usageHint(c, "want one vGPU id (gpuvm vgpu list shows them), got %d arguments", len(args))
				}
				url += "/" + args[0]
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
		Usage: "list, inspect or destroy the aggregator's vGPUs; list the vGPU profiles",
		Subcommands: []*cli.Command{
			{Name: "list", Usage: "every vGPU with its counters (JSON)", Flags: []cli.Flag{ctl}, Action: call(http.MethodGet, "/v1/vgpus", false)},
			{Name: "stats", Usage: "one vGPU's counters (JSON)", ArgsUsage: "ID", Flags: []cli.Flag{ctl}, Action: call(http.MethodGet, "/v1/vgpus", true)},
			{Name: "destroy", Usage: "tear a vGPU down; its VM loses the GPU", ArgsUsage: "ID", Flags: []cli.Flag{ctl}, Action: call(http.MethodDelete, "/v1/vgpus", true)},
			{Name: "layout", Usage: "how the board is partitioned (JSON)", Flags: []cli.Flag{ctl}, Action: call(http.MethodGet, "/v1/layout", false)},
			vgpuTypesCommand(ctl),
		},
	}
}
