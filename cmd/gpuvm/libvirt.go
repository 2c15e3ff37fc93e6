package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/internal/libvirtwatch"
	"github.com/gpuvm/gpuvm/internal/vgpumeta"
)

func libvirtCommand() *cli.Command {
	return &cli.Command{
		Name:  "libvirt",
		Usage: "give libvirt domains their vGPUs as they start and stop (the <metadata> of their XML asks)",
		Description: "Connects to libvirtd (--libvirt-socket, --connect) and follows its domain lifecycle\n" +
			"events. A domain whose XML has gpuvm's element in <metadata>, e.g.\n\n" +
			"    <gpuvm:vgpu xmlns:gpuvm=\"" + vgpumeta.Namespace + "\"\n" +
			"                mode=\"fv-optimized\" profile=\"vgpu-256m\"/>\n\n" +
			"(attributes: " + strings.Join(vgpumeta.Attributes(), ", ") + "), gets a vGPU when it starts:\n" +
			"its settings are registered with the aggregator (gpuvm serve) and its device model is\n" +
			"launched; when the domain stops or crashes the device model is stopped, which tears the\n" +
			"vGPU down. A domain whose metadata is wrong runs without a vGPU, and the log says why.\n" +
			"When libvirtd goes away (a restart) gpuvm libvirt reconnects with backoff and reconciles\n" +
			"with the domains then running. SIGINT or SIGTERM stop every device model it launched.\n" +
			"Device models: for test:///... connections (libvirt's test driver) each domain gets a\n" +
			"`gpuvm devmodel --hold` process, the in-process harness's device model, which keeps a real\n" +
			"vGPU attached for as long as the domain runs; for Xen (xen:///system) the device model of\n" +
			"gpuvm xl create is not started from libvirt yet (docs/libvirt.md).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "connect", Aliases: []string{"c"}, Value: "xen:///system", Usage: "the libvirt URI (test:///default: libvirt's test driver)"},
			&cli.PathFlag{Name: "libvirt-socket", Value: "/var/run/libvirt/libvirt-sock", Usage: "libvirtd's socket"},
			&cli.PathFlag{Name: "socket", Value: config.Default().Daemon.Socket, Usage: "the aggregator's device-model socket"},
			&cli.PathFlag{Name: "control-socket", Value: config.Default().Daemon.ControlSocket, Usage: "the aggregator's control socket"},
			&cli.StringFlag{Name: "harness-ram", Value: "128MiB", Usage: "test:/// domains: the guest RAM each device model creates"},
			&cli.StringFlag{Name: "harness-workloads", Value: "nop", Usage: "test:/// domains: the workloads each device model runs on its vGPU once attached"},
			&cli.DurationFlag{Name: "reconnect-max", Value: libvirtwatch.DefaultMaxBackoff, Usage: "the longest wait between attempts to reach libvirtd (the wait doubles up to it)"},
		},
		Action: runLibvirt,
	}
}

func runLibvirt(c *cli.Context) error {
	if !c.IsSet("log-level") {
		_ = c.Set("log-level", "info") // what it attaches and tears down is its output
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	uri := c.String("connect")
	launcher, err := libvirtLauncher(c, uri)
	if err != nil {
		return err
	}
	ctl := c.Path("control-socket")
	w, err := libvirtwatch.New(libvirtwatch.Config{
		Dial:       libvirtwatch.Dialer(c.Path("libvirt-socket"), uri),
		Registry:   controlRegistry{socket: ctl},
		Launcher:   launcher,
		Logger:     log,
		MaxBackoff: c.Duration("reconnect-max"),
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "gpuvm libvirt: following %s on %s; vGPUs from the aggregator on %s\n", uri, c.Path("libvirt-socket"), ctl)
	if err := w.Run(c.Context); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	return nil
}

// libvirtLauncher is the device-model launcher for uri's driver.
func libvirtLauncher(c *cli.Context, uri string) (libvirtwatch.Launcher, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme == "" {
		return nil, usageHint(c, "--connect %q: want a libvirt URI such as xen:///system or test:///default", uri)
	}
	driver, _, _ := strings.Cut(u.Scheme, "+") // xen+ssh, test+unix
	switch driver {
	case "test":
		ram, err := parseSize(c.String("harness-ram"))
		if err != nil {
			return nil, usageError("--harness-ram: %v", err)
		}
		log, err := newLogger(c)
		if err != nil {
			return nil, err
		}
		return &libvirtwatch.ProcessLauncher{
			Command:   func(args []string) *exec.Cmd { return selfCommand(context.Background(), args) },
			Socket:    c.Path("socket"),
			RAM:       strconv.FormatUint(ram, 10),
			Workloads: c.String("harness-workloads"),
			Logger:    log,
		}, nil
	case "xen":
		return nil, usageHint(c, "--connect %s: starting a Xen domain's device model (the one of gpuvm xl create) from libvirt is not implemented yet; "+
			"use gpuvm xl create for Xen domains (docs/libvirt.md, \"Xen domains\")", uri)
	}
	return nil, usageHint(c, "--connect %s: gpuvm gives vGPUs to Xen domains, and to the test driver's (test:///default) through device-model processes; "+
		"a %s domain cannot use them", uri, driver)
}

// controlRegistry registers domains' vGPU settings through the aggregator's
// control API.
type controlRegistry struct{ socket string }

// Register is PUT /v1/domains/{domid}.
func (r controlRegistry) Register(ctx context.Context, domid uint32, v vgpumeta.VGPU) error {
	body, err := json.Marshal(aggregator.DomainSettings{Mode: string(v.Mode), Profile: v.Profile, VRAM: uint64(v.VRAM),
		Channels: v.Channels, BAR1: uint64(v.BAR1), BAR3: uint64(v.BAR3), Weight: v.Weight})
	if err != nil {
		return err
	}
	return r.do(ctx, http.MethodPut, domid, body, "refused the vGPU settings")
}

// Forget is DELETE /v1/domains/{domid}.
func (r controlRegistry) Forget(ctx context.Context, domid uint32) error {
	return r.do(ctx, http.MethodDelete, domid, nil, "did not forget the vGPU settings")
}

// do sends method to /v1/domains/{domid}; failed says what the aggregator
// did if it does not answer 200 OK.
func (r controlRegistry) do(ctx context.Context, method string, domid uint32, body []byte, failed string) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://aggregator/v1/domains/"+strconv.FormatUint(uint64(domid), 10), bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := controlClient(r.socket).Do(req)
	if err != nil {
		// Any gpuvm serve: libvirt's domains need no --xen.
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("the aggregator %s of domain %d: %s: %s", failed, domid, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
