package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/host"
)

// controlDo calls the control API and returns the response body, or an
// error carrying the API's own message for a failed call.
func controlDo(c *cli.Context, method, path string) ([]byte, error) {
	return controlDoWithin(c, method, path, 0)
}

// controlDoWithin is controlDo with a client timeout other than the
// default (0: the default), for calls that take long (a drain).
func controlDoWithin(c *cli.Context, method, path string, timeout time.Duration) ([]byte, error) {
	req, err := http.NewRequestWithContext(c.Context, method, "http://aggregator"+path, nil)
	if err != nil {
		return nil, err
	}
	client := controlClient(c.Path("control-socket"))
	if timeout > 0 {
		client.Timeout = timeout
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return nil, &exitError{code: exitFailure, err: fmt.Errorf("control API: %s: %s", resp.Status, e.Error)}
		}
		return nil, &exitError{code: exitFailure, err: fmt.Errorf("control API: %s", resp.Status)}
	}
	return body, nil
}

func boardCommand() *cli.Command {
	ctl := &cli.PathFlag{Name: "control-socket", Value: config.Default().Daemon.ControlSocket, Usage: "the aggregator's control socket"}
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print the control API's JSON"}
	named := func(verb string) cli.ActionFunc {
		return func(c *cli.Context) error {
			args := positional(c)
			if len(args) != 1 {
				return usageHint(c, "want one board name (gpuvm board list shows them), got %d arguments", len(args))
			}
			body, err := controlDo(c, http.MethodPost, "/v1/boards/"+url.PathEscape(args[0])+"/"+verb)
			if err != nil {
				return err
			}
			_, err = c.App.Writer.Write(body)
			return err
		}
	}
	return &cli.Command{
		Name:  "board",
		Usage: "list the host's GPUs, their states and loads; cordon or drain one; see placement decisions",
		Description: "A daemon owns every board its configuration declares ([[boards]], or [board] alone)\n" +
			"and places each VM that connects on one of them: a board that fits (active, a free\n" +
			"slot, the one its [[vm]] entry pins), then the least loaded, the fewest submissions\n" +
			"queued, the least weight placed, configuration order (docs/design.md, \"Several boards\").\n" +
			"[daemon] placement = \"pack\" fills boards in order instead. gpuvm vgpu move ID --to BOARD\n" +
			"moves one running vGPU; drain moves every one that can move off a board. [daemon] balance =\n" +
			"\"load\" moves vGPUs from the busiest board to the least loaded one as they run.",
		Subcommands: []*cli.Command{
			{Name: "list", Usage: "every board: state, slots, load over the last 2 s, queued submissions, weight placed",
				Flags: []cli.Flag{ctl, jsonFlag}, Action: func(c *cli.Context) error {
					body, err := controlDo(c, http.MethodGet, "/v1/boards")
					if err != nil {
						return err
					}
					if c.Bool("json") {
						_, err = c.App.Writer.Write(body)
						return err
					}
					var boards []host.BoardInfo
					if err := json.Unmarshal(body, &boards); err != nil {
						return fmt.Errorf("control API: %w", err)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "BOARD\tNAME\tSTATE\tTIMING\tUSED\tFREE\tOUT\tLOAD\tQUEUED\tWEIGHT")
					for _, b := range boards {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%d\t%.0f%%\t%d\t%d\n", b.Index, b.Name, b.State, b.Timing,
							b.Used, b.Free, b.OutOfService, 100*b.Load, b.Queued, b.Weight)
					}
					if err := tw.Flush(); err != nil {
						return err
					}
					for _, b := range boards {
						if b.Lost != "" {
							fmt.Fprintf(c.App.Writer, "board %s failed: %s\n", b.Name, b.Lost)
						}
					}
					return nil
				}},
			{Name: "layout", Usage: "how a board is partitioned (JSON)", ArgsUsage: "NAME", Flags: []cli.Flag{ctl}, Action: func(c *cli.Context) error {
				args := positional(c)
				if len(args) != 1 {
					return usageHint(c, "want one board name (gpuvm board list shows them), got %d arguments", len(args))
				}
				body, err := controlDo(c, http.MethodGet, "/v1/boards/"+url.PathEscape(args[0])+"/layout")
				if err != nil {
					return err
				}
				_, err = c.App.Writer.Write(body)
				return err
			}},
			{Name: "cordon", Usage: "take a board out of placement: its vGPUs stay, no new one is placed on it", ArgsUsage: "NAME", Flags: []cli.Flag{ctl}, Action: named("cordon")},
			{Name: "uncordon", Usage: "put a cordoned board back into placement", ArgsUsage: "NAME", Flags: []cli.Flag{ctl}, Action: named("uncordon")},
			{Name: "drain", Usage: "take a board out of placement and move every vGPU that can move to the other boards (the fully virtualized ones)",
				ArgsUsage: "NAME", Flags: []cli.Flag{ctl, jsonFlag}, Action: func(c *cli.Context) error {
					args := positional(c)
					if len(args) != 1 {
						return usageHint(c, "want one board name (gpuvm board list shows them), got %d arguments", len(args))
					}
					body, err := controlDoWithin(c, http.MethodPost, "/v1/boards/"+url.PathEscape(args[0])+"/drain", 6*time.Minute)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						_, err = c.App.Writer.Write(body)
						return err
					}
					var res host.DrainResult
					if err := json.Unmarshal(body, &res); err != nil {
						return fmt.Errorf("control API: %w", err)
					}
					for _, m := range res.Moved {
						fmt.Fprintf(c.App.Writer, "moved vGPU %d: board %s slot %d -> board %s slot %d, %s copied, paused %v\n", m.ID, m.FromBoard, m.FromSlot,
							m.ToBoard, m.ToSlot, config.Size(m.BytesCopied), time.Duration(m.DowntimeNs).Round(time.Microsecond))
					}
					for _, l := range res.Left {
						fmt.Fprintf(c.App.Writer, "left vGPU %d (%s) on board %s: %s\n", l.ID, l.Name, res.Board, l.Reason)
					}
					fmt.Fprintf(c.App.Writer, "board %s is cordoned: %d moved, %d left\n", res.Board, len(res.Moved), len(res.Left))
					if len(res.Left) > 0 {
						return &exitError{code: exitFailure, err: fmt.Errorf("board %s not empty: %d vGPUs could not move", res.Board, len(res.Left))}
					}
					return nil
				}},
			{Name: "fail", Usage: "make a simulated board fall off the bus (needs gpuvm serve --fault-injection): its vGPUs are lost devices, the others carry on",
				ArgsUsage: "NAME", Flags: []cli.Flag{ctl}, Action: named("fail")},
			{Name: "repair", Usage: "put a simulated board that fell off the bus back on it, power-cycled (needs gpuvm serve --fault-injection); then gpuvm board reinit",
				ArgsUsage: "NAME", Flags: []cli.Flag{ctl}, Action: named("repair")},
			{Name: "reinit", Usage: "bring a failed board that answers again back into service: its slots renewed, placement back on; its lost vGPUs come back with a reset (gpuvm vgpu reset ID, or the guest's FLR)",
				ArgsUsage: "NAME", Flags: []cli.Flag{ctl}, Action: named("reinit")},
			{Name: "placements", Usage: "the latest placement decisions and moves (kind place, move or balance), each with every board's figures and the reason (JSON)", Flags: []cli.Flag{ctl},
				Action: func(c *cli.Context) error {
					body, err := controlDo(c, http.MethodGet, "/v1/placements")
					if err != nil {
						return err
					}
					_, err = c.App.Writer.Write(body)
					return err
				}},
			{Name: "balance", Usage: "the load balancer ([daemon] balance): its settings, moves, the vGPUs it holds, and its latest looks, each with the reason (JSON)", Flags: []cli.Flag{ctl},
				Action: func(c *cli.Context) error {
					body, err := controlDo(c, http.MethodGet, "/v1/balance")
					if err != nil {
						return err
					}
					_, err = c.App.Writer.Write(body)
					return err
				}},
		},
	}
}
