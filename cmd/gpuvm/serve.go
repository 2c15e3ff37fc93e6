package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/metrics"
	"github.com/gpuvm/gpuvm/xen"
	"github.com/gpuvm/gpuvm/xen/foreign"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "run the GPU Access Aggregator daemon",
		Description: "Takes the physical GPU (the embedded simulated board unless the config says\n" +
			"otherwise), partitions it as the [partition] table says, and serves device models on\n" +
			"daemon.socket: each connecting VM gets a vGPU until its device model goes away. The\n" +
			"control API (`gpuvm vgpu ...`) listens on daemon.control_socket. SIGINT or SIGTERM shut\n" +
			"it down cleanly: every vGPU is torn down and every slice scrubbed. SIGUSR2 upgrades it in\n" +
			"place: every vGPU is handed to the binary now at the daemon's path, exec'ed in the same PID,\n" +
			"with the board's VRAM kept where it is, and the guests pause and go on (refused while a\n" +
			"Xen domain whose device model does not resume is attached; docs/protocol.md §15).",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "config", Aliases: []string{"c"}, Usage: "TOML config (see examples/gpuvm.toml); defaults apply without one"},
			&cli.PathFlag{Name: "socket", Usage: "override daemon.socket"},
			&cli.PathFlag{Name: "control-socket", Usage: "override daemon.control_socket"},
			&cli.StringFlag{Name: "metrics-listen", Usage: "override metrics.listen: serve Prometheus metrics on a Unix socket (an absolute path) or TCP host:port; \"\" turns them off"},
			&cli.BoolFlag{Name: "xen", Usage: "serve guests of real Xen (run in dom0): device models may offer their domain's own RAM, which the daemon maps through /dev/xen/privcmd (gpuvm xl create starts such device models)"},
			&cli.PathFlag{Name: "xen-dir", Value: "/dev/xen", Usage: "where privcmd is, with --xen"},
			&cli.BoolFlag{Name: "fault-injection", Usage: "let `gpuvm board fail NAME` make a simulated board fall off the bus, and `gpuvm board repair NAME` put it back (for tests of a lost GPU; never in production)"},
			&cli.IntFlag{Name: "ipc-spin", Usage: "polls of an empty request ring before sleeping, 0 never (default: 20000, or never with --xen, where a spinning dom0 vCPU holds the CPU a trapped guest waits for)"},
		},
		Action: runServe,
	}
}

func loadConfig(c *cli.Context) (config.Config, error) {
	cfg := config.Default()
	if path := c.Path("config"); path != "" {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return cfg, usageError("%v", err)
		}
	}
	if s := c.Path("socket"); s != "" {
		cfg.Daemon.Socket = s
	}
	if s := c.Path("control-socket"); s != "" {
		cfg.Daemon.ControlSocket = s
	}
	if c.IsSet("metrics-listen") {
		cfg.Metrics.Listen = c.String("metrics-listen")
		if cfg.Metrics.Listen != "" {
			if _, _, err := config.MetricsAddr(cfg.Metrics.Listen); err != nil {
				return cfg, usageError("--metrics-listen: %v", err)
			}
		}
	}
	return cfg, nil
}

// serverSpin is the aggregator's IPC spin budget: the flag, else none on
// Xen, else the default.
func serverSpin(c *cli.Context) int {
	switch {
	case c.IsSet("ipc-spin"):
		if n := c.Int("ipc-spin"); n > 0 {
			return n
		}
		return -1
	case c.Bool("xen"):
		return -1
	}
	return 0
}

func runServe(c *cli.Context) error {
	usr2 := handoffSignal()
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if !c.IsSet("log-level") {
		var lv = map[config.LogLevel]string{"debug": "debug", "info": "info", "warn": "warn", "error": "error"}[cfg.Daemon.LogLevel]
		_ = c.Set("log-level", lv)
		if log, err = newLogger(c); err != nil {
			return err
		}
	}
	// What a previous process of this PID handed over (handoff.go), taken
	// before anything else so that none of it leaks.
	inh, orphans, err := inheritHandoff()
	if err != nil {
		log.Error("handoff: what the previous process handed over is unusable: starting afresh", "err", err)
	}
	h, err := newHost(c, cfg, log, inh)
	if err != nil {
		if inh != nil {
			inh.close()
		}
		return err
	}
	defer h.Close()
	for _, err := range h.AbandonXenPVDRM(orphans) {
		log.Error("handoff: a handed-over pvdrm device could not be closed: its guest's front end waits", "err", err)
	}
	for _, p := range []string{cfg.Daemon.Socket, cfg.Daemon.ControlSocket} {
		if err := socketDir(filepath.Dir(p)); err != nil {
			return err
		}
	}
	ln, cln, err := listenSockets(cfg, inh, h, serverSpin(c), log)
	if err != nil {
		return err
	}
	defer ln.Close()
	ctl := serveControl(cfg.Daemon.ControlSocket, cln, h.ControlHandler())
	defer ctl.close()
	up := &upgrader{h: h, log: log, ln: ln, ctl: ctl, exec: syscall.Exec}
	go up.watch(c.Context, usr2)
	if cfg.Metrics.Listen != "" {
		msrv, err := serveMetrics(cfg.Metrics.Listen, h, log)
		if err != nil {
			return err
		}
		defer msrv.Close()
		fmt.Fprintf(c.App.ErrWriter, "gpuvm: Prometheus metrics on %s (GET /metrics)\n", cfg.Metrics.Listen)
	}
	slots := len(h.Layout().Slots)
	log.Info("aggregator serving", "socket", cfg.Daemon.Socket, "control", cfg.Daemon.ControlSocket,
		"boards", len(h.Boards()), "vms", slots, "vram_per_vm", cfg.Partition.VRAMPerVM.String())
	if n := len(h.Boards()); n > 1 {
		fmt.Fprintf(c.App.ErrWriter, "gpuvm: serving %d vGPU slots on %d boards on %s (control: %s)\n", slots, n, cfg.Daemon.Socket, cfg.Daemon.ControlSocket)
	} else {
		fmt.Fprintf(c.App.ErrWriter, "gpuvm: serving %d vGPU slots on %s (control: %s)\n", slots, cfg.Daemon.Socket, cfg.Daemon.ControlSocket)
	}
	err = h.Serve(c.Context, ln)
	log.Info("aggregator stopping", "reason", context.Cause(c.Context))
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// socketDir makes sure dir exists (created mode 0700) and that nobody but
// this user (or root) can replace what is in it: it must be a directory,
// not a symbolic link, owned by this user or root, and writable by others
// only if sticky (as /tmp is). A device model connecting to a socket
// another user planted would hand that user its guest RAM.
func socketDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("socket directory %s: not a directory", dir)
	case !ok:
	case int(st.Uid) != os.Geteuid() && st.Uid != 0:
		return fmt.Errorf("socket directory %s: owned by uid %d, not by this user (uid %d) or root; choose another with --socket/--control-socket or daemon.socket", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
		return fmt.Errorf("socket directory %s: writable by other users (mode %v), who could replace the sockets", dir, fi.Mode().Perm())
	}
	return nil
}

// domainRAM is how the daemon maps a Xen domain's own RAM (with --xen; nil
// otherwise): a privcmd handle restricted to that domain, the frames the
// domain populates mapped, its holes zero pages of our own.
func domainRAM(c *cli.Context, log *slog.Logger) func(uint32, uint64) ([]byte, func() error, error) {
	if !c.Bool("xen") {
		return nil
	}
	dir := c.Path("xen-dir")
	return func(domid uint32, size uint64) ([]byte, func() error, error) {
		h, err := privcmd.Open(dir)
		if err != nil {
			return nil, nil, err
		}
		if err := h.Restrict(uint16(domid)); err != nil {
			return nil, nil, errors.Join(err, h.Close())
		}
		ram, err := foreign.MapPopulated(h, uint16(domid), int(size/xen.PageSize))
		if err != nil {
			return nil, nil, errors.Join(err, h.Close())
		}
		var populated uint64
		for _, e := range ram.Extents() {
			populated += e.Pages
		}
		log.Info("domain RAM mapped", "domid", domid, "bytes", size, "pages_with_ram", populated)
		return ram.Bytes(), func() error { return errors.Join(ram.Close(), h.Close()) }, nil
	}
}

// profiles are the configuration's vGPU profiles as the aggregator serves them.
func profiles(cfg config.Config) []aggregator.Profile {
	var out []aggregator.Profile
	for _, p := range cfg.AllProfiles() {
		out = append(out, aggregator.Profile{Name: p.Name, Description: p.Description, VRAM: uint64(p.VRAM),
			Channels: p.Channels, BAR1: uint64(p.BAR1), BAR3: uint64(p.BAR3), Weight: p.Weight})
	}
	return out
}

// maxMetricsConns bounds the metrics endpoint's open connections.
const maxMetricsConns = 16

// serveMetrics serves the Prometheus endpoint on listen (config.MetricsAddr):
// a Unix socket is created as the control socket is (a safe directory, a
// live socket refused), a TCP address listened on as given.
func serveMetrics(listen string, src metrics.Source, log *slog.Logger) (*http.Server, error) {
	network, addr, err := config.MetricsAddr(listen)
	if err != nil {
		return nil, usageError("metrics.listen: %v", err)
	}
	var ln net.Listener
	if network == "unix" {
		if err := socketDir(filepath.Dir(addr)); err != nil {
			return nil, err
		}
		ln, err = ipc.ListenStream(addr)
	} else {
		ln, err = net.Listen(network, addr)
	}
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(src))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "gpuvm aggregator: metrics at /metrics")
	})
	// Whoever can reach the endpoint may not make the daemon hold
	// unbounded connections or scrapes (metrics.Handler bounds those in
	// flight).
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second}
	go func() {
		if err := srv.Serve(newLimitListener(ln, maxMetricsConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "err", err)
		}
	}()
	return srv, nil
}
