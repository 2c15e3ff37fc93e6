package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/host"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/xen/privcmd"
	"github.com/gpuvm/gpuvm/xen/xenstore"
	"github.com/gpuvm/gpuvm/xen/xlcfg"
)

func xlCommand() *cli.Command {
	return &cli.Command{
		Name:  "xl",
		Usage: "create, save and restore Xen domains with a vGPU",
		Subcommands: []*cli.Command{{
			Name:      "create",
			Usage:     "create a domain from its xl config and attach the vGPU its gpuvm key asks for",
			ArgsUsage: "CONFIG",
			Description: "Reads CONFIG, an ordinary xl domain config with one more key, e.g.\n\n" +
				"    gpuvm = \"mode=fv-optimized, vram=256MiB, channels=8, weight=2\"\n" +
				"    gpuvm = \"mode=pv-multicall, profile=vgpu-256m\"   (a profile: gpuvm vgpu types)\n\n" +
				"(xl itself ignores keys it does not know), and then, in dom0, with gpuvm serve --xen\n" +
				"running: creates the domain paused (xl create -p), registers the vGPU's settings with\n" +
				"the aggregator, starts the domain's device model (a Xen ioreq server claiming the vGPU's\n" +
				"PCI function and BARs, forwarding to the aggregator, which maps the domain's own RAM),\n" +
				"unpauses it, and serves it in the foreground until the domain goes (xl destroy,\n" +
				"shutdown, a crash): the vGPU is then torn down. SIGINT or SIGTERM tear the vGPU down\n" +
				"and destroy the domain, which cannot run without its device model.\n" +
				"HVM guests find the vGPU by PCI enumeration (hvmloader places its BARs); a PVH guest\n" +
				"has no such firmware, so the BARs are placed at --bars and printed for the guest\n" +
				"(gpuvm guest --bars ...).\n" +
				"In mode pvdrm or pvdrm-pooling (any domain type; pv domains have no other) there is no\n" +
				"device model: the aggregator creates the domain's pvdrm device in xenstore and serves its\n" +
				"back end (the ring and the GART heap the guest grants; gpuvm guest --mode pvdrm in the\n" +
				"guest is the front end), and this command watches the domain until it goes.",
			Flags: append(xlDaemonFlags(),
				&cli.StringFlag{Name: "pci", Value: "0000:00:05.0", Usage: "the vGPU's PCI function in the guest"},
				&cli.StringFlag{Name: "bars", Value: "0xe0000000,0xc000", Usage: "PVH guests: where to place the memory BARs (from this guest-physical address up) and the I/O BAR (port)"},
				xlResumeFlag()),
			Action: runXLCreate,
		}, xlSaveCommand(), xlRestoreCommand()},
	}
}

// xlDomain is what gpuvm xl create needs from the domain's config.
type xlDomain struct {
	vgpu   xlcfg.VGPU
	memory uint64 // bytes (xl's memory, MiB)
	// overrides are KEY=VALUE settings passed to xl create after the file.
	overrides []string
}

// restartActions are the xl on_* actions that start the domain again,
// under a new domain id or (soft-reset) with its memory rebuilt, which the
// device model (serving one domain id) and the aggregator's mapping of
// its RAM would not follow.
var restartActions = map[string]bool{"restart": true, "rename-restart": true, "coredump-restart": true, "soft-reset": true}

func readXLConfig(path string) (xlDomain, error) {
	f, err := xlcfg.Load(path)
	if err != nil {
		return xlDomain{}, err
	}
	v, ok, err := f.ReadVGPU()
	if err != nil {
		return xlDomain{}, err
	}
	if !ok {
		return xlDomain{}, fmt.Errorf("%s: no %s key: nothing for gpuvm to attach (add e.g. %s = \"mode=fv-optimized\")", path, xlcfg.Key, xlcfg.Key)
	}
	d := xlDomain{vgpu: v, memory: 128 << 20} // xl's default
	if s, ok := f.Get("memory"); ok {
		if s.Value.Kind != xlcfg.Number || s.Value.Num < 1 || s.Value.Num > 1<<20 || s.Value.Num != float64(int64(s.Value.Num)) {
			return xlDomain{}, &xlcfg.Error{Path: path, Pos: s.Value.Pos, Key: "memory", Msg: "want a whole number of MiB"}
		}
		d.memory = uint64(s.Value.Num) << 20
	}
	// A guest that reboots or crashes must end, not come back without its
	// vGPU: xl's default on_reboot ("restart") is overridden, and a
	// configured restart is refused.
	for _, key := range []string{"on_reboot", "on_crash", "on_watchdog"} {
		act, ok, err := f.String(key)
		if err != nil {
			return xlDomain{}, err
		}
		if ok && restartActions[act] {
			s, _ := f.Get(key)
			return xlDomain{}, &xlcfg.Error{Path: path, Pos: s.Value.Pos, Key: key,
				Msg: fmt.Sprintf("%q starts the domain again without its vGPU; use \"destroy\" (gpuvm xl create then ends; create the domain again for a new vGPU)", act)}
		}
		if !ok && key == "on_reboot" {
			d.overrides = append(d.overrides, `on_reboot="destroy"`)
		}
	}
	return d, nil
}

// goneAfter is how many liveness looks in a row must find a domain gone
// before its vGPU is torn down.
const goneAfter = 3

func runXLCreate(c *cli.Context) error {
	args := positional(c)
	if len(args) != 1 {
		return usageHint(c, "want one xl config file, got %d arguments", len(args))
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	dom, err := readXLConfig(args[0])
	if err != nil {
		return usageError("%v", err)
	}
	sbdf, err := privcmd.ParseSBDF(c.String("pci"))
	if err != nil {
		return usageError("--pci: %v", err)
	}
	var placeMem, placeIO uint64
	if dom.vgpu.Type == "pvh" && !dom.vgpu.Mode.IsPVDRM() {
		if placeMem, placeIO, err = parseBars(c.String("bars")); err != nil {
			return usageError("--bars: %v", err)
		}
	}
	say := xlSay(c)
	xl := func(ctx context.Context, a ...string) (string, error) { return runXL(ctx, c, a...) }

	ctx := c.Context
	t0 := time.Now()
	if _, err := xl(ctx, append([]string{"create", "-p", args[0]}, dom.overrides...)...); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	out, err := xl(ctx, "domid", dom.vgpu.Name)
	domid, perr := strconv.ParseUint(out, 10, 32)
	if err == nil && perr != nil {
		err = fmt.Errorf("xl domid %s printed %q", dom.vgpu.Name, out)
	}
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	destroy := xlDestroyer(c, uint32(domid), say)
	say("domain %s is %d (paused), created in %.1fs", dom.vgpu.Name, domid, time.Since(t0).Seconds())
	settings := aggregator.DomainSettings{Mode: string(dom.vgpu.Mode), Profile: dom.vgpu.Profile, VRAM: uint64(dom.vgpu.VRAM), Channels: dom.vgpu.Channels, Weight: dom.vgpu.Weight}
	if err := putDomainSettings(ctx, c.Path("control-socket"), uint32(domid), settings); err != nil {
		destroy("the vGPU settings were not registered")
		return &exitError{code: exitFailure, err: err}
	}
	if dom.vgpu.Mode.IsPVDRM() {
		rec := xlSaveRecord{Version: xlRecordVersion, Name: dom.vgpu.Name, Type: dom.vgpu.Type, Mode: string(dom.vgpu.Mode), Settings: settings}
		return runXLPVDRM(ctx, c, rec, uint32(domid), t0, say, destroy, log)
	}
	// The aggregator maps the domain's RAM up to the top of its memory;
	// HVM guests have it a little higher (the VGA hole), and frames the
	// domain does not populate become zero pages.
	rec := xlSaveRecord{Version: xlRecordVersion, Name: dom.vgpu.Name, Type: dom.vgpu.Type, Mode: string(dom.vgpu.Mode),
		RAMSpan: (dom.memory + 16<<20 + 0xFFFFF) &^ 0xFFFFF, PCI: c.String("pci"), Settings: settings}
	return serveXenVGPU(ctx, c, rec, uint32(domid), xenVGPUStart{sbdf: sbdf, placeMem: placeMem, placeIO: placeIO}, t0, say, destroy, log)
}

// xenVGPUStart is how a domain's device model starts: fresh (its BARs
// placed at placeMem and placeIO for a PVH guest, or by the guest's
// firmware), or resuming a saved vGPU with the placements it had.
type xenVGPUStart struct {
	sbdf              privcmd.SBDF
	placeMem, placeIO uint64
	resume            bool
	placements        []devmodel.BARPlacement
}

// serveXenVGPU starts domain domid's device model (the domain created
// paused, its settings registered), unpauses the domain and serves it
// until it goes. The device model keeps rec, with its BAR placements, in
// xenstore for gpuvm xl save.
func serveXenVGPU(ctx context.Context, c *cli.Context, rec xlSaveRecord, domid uint32, st xenVGPUStart, t0 time.Time, say func(string, ...any), destroy func(string), log *slog.Logger) error {
	xs, err := xenstore.Open()
	if err != nil {
		destroy("no xenstore")
		return &exitError{code: exitFailure, err: fmt.Errorf("xenstore: %w", err)}
	}
	defer xs.Close()
	publish := func(ps []devmodel.BARPlacement) {
		rec.Placements = ps
		if err := publishXLRecord(ctx, xs, domid, rec); err != nil {
			log.Warn("recording the device model for gpuvm xl save", "domid", domid, "err", err)
		}
	}
	m, err := devmodel.StartXen(ctx, devmodel.XenConfig{Socket: c.Path("socket"), DomID: domid, Name: rec.Name,
		Mode: rec.Mode, RAMSize: rec.RAMSpan, Device: st.sbdf, PlaceMem: st.placeMem, PlaceIO: st.placeIO, Placements: st.placements,
		Resume: st.resume, OnPlacements: publish, XenDir: c.Path("xen-dir"), Spin: c.Int("ipc-spin"), Logger: log,
		ResumeTimeout: c.Duration("resume-timeout")})
	if err != nil {
		destroy("no device model")
		return &exitError{code: exitFailure, err: noDaemonHint(err, "gpuvm serve --xen", "--socket")}
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = xs.Rm(rctx, xlRecordPath(domid))
	}()
	w := m.Welcome()
	verb := "attached"
	if st.resume {
		verb = "restored"
	}
	say("vGPU %d %s: mode %s, %d MiB VRAM, %d channels", w.VGPU, verb, rec.Mode, w.VRAMSize>>20, w.Channels)
	if st.placeMem != 0 || (st.resume && rec.Type == "pvh") {
		say("BARs placed for the PVH guest: gpuvm guest --bars %s", barsArg(m.Placements()))
	}
	if _, err := runXL(ctx, c, "unpause", strconv.FormatUint(uint64(domid), 10)); err != nil {
		destroy("unpause failed")
		return &exitError{code: exitFailure, err: errors.Join(err, m.Close())}
	}
	say("domain %d running (%.1fs after xl %s); serving its vGPU until it goes", domid, time.Since(t0).Seconds(), map[bool]string{false: "create", true: "restore"}[st.resume])
	return serveDomain(ctx, m, c.Path("xen-dir"), domid, say, destroy, log)
}

// serveDomain serves the domain's device model until the domain is gone,
// a signal asks to stop (the domain is destroyed too), or the vGPU goes.
func serveDomain(ctx context.Context, m *devmodel.XenModel, xenDir string, domid uint32, say func(string, ...any), destroy func(string), log *slog.Logger) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			cancel(fmt.Errorf("%w %v", errSignal, s))
		case <-ctx.Done():
		}
	}()
	// The domain's liveness. A destroyed domain whose RAM the aggregator
	// still maps lingers (dying) until the vGPU lets go, and a dm_op on it
	// still succeeds; but the toolstack removes its xenstore directory as
	// it destroys it. A dm_op failing catches a domain gone otherwise.
	h, err := privcmd.Open(xenDir)
	if err != nil {
		return errors.Join(err, m.Close())
	}
	defer h.Close()
	xs, err := xenstore.Open()
	if err != nil {
		return errors.Join(fmt.Errorf("xenstore: %w", err), m.Close())
	}
	defer xs.Close()
	errGone := errors.New("the domain is gone")
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		key := fmt.Sprintf("/local/domain/%d/domid", domid)
		misses := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, xerr := xs.Read(ctx, key)
			_, derr := h.NrVCPUs(uint16(domid))
			if !errors.Is(xerr, fs.ErrNotExist) && derr == nil {
				misses = 0
				continue
			}
			// Under load a single look can fail for a live domain (seen
			// on the test bed): only goneAfter in a row end the vGPU.
			if misses++; misses < goneAfter {
				log.Warn("domain looks gone; looking again", "domid", domid, "xenstore", xerr, "dm_op", derr, "look", misses)
				continue
			}
			say("domain %d is gone (xenstore: %v; dm_op: %v)", domid, xerr, derr)
			cancel(errGone)
			return
		}
	}()
	serr := m.Serve(ctx)
	st := m.Stats()
	cerr := m.Close()
	cause := context.Cause(ctx)
	say("vGPU torn down after %d accesses served (%d refused); the device model took %s per access (the aggregator's answer over IPC)",
		st.Served, st.Refused, bench.FormatDuration(int64(st.MeanHandlerTime())))
	switch {
	case errors.Is(cause, errGone): // said when it was seen
		return nil
	case ipc.IsSavedBye(serr):
		// gpuvm xl save took the vGPU's state with the domain's: the
		// domain is its to destroy.
		say("the vGPU of domain %d was saved (gpuvm xl save); its device model ends", domid)
		return nil
	case errors.Is(cause, errSignal):
		destroy(cause.Error())
		return nil
	}
	destroy(fmt.Sprint(serr))
	return &exitError{code: exitFailure, err: errors.Join(serr, cerr)}
}

// runXLPVDRM has the aggregator serve the pvdrm back end of domain domid
// (created paused, its settings registered; restored, its image given to
// the daemon), unpauses the domain and waits until it goes. It keeps rec
// in xenstore for gpuvm xl save meanwhile.
func runXLPVDRM(ctx context.Context, c *cli.Context, rec xlSaveRecord, domid uint32, t0 time.Time, say func(string, ...any), destroy func(string), log *slog.Logger) error {
	socket := c.Path("control-socket")
	if xs, err := xenstore.Open(); err != nil {
		log.Warn("recording the domain for gpuvm xl save", "domid", domid, "err", err)
	} else {
		defer xs.Close()
		if err := publishXLRecord(ctx, xs, domid, rec); err != nil {
			log.Warn("recording the domain for gpuvm xl save", "domid", domid, "err", err)
		}
		defer func() { // no toolstack removes it for a domain with no device model
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := xs.Rm(rctx, xlRecordPath(domid)); err != nil {
				log.Debug("remove the gpuvm xl save record", "domid", domid, "err", err)
			}
		}()
	}
	body, _ := json.Marshal(host.XenPVDRMRequest{Name: rec.Name})
	if err := controlCall(ctx, socket, http.MethodPost, fmt.Sprintf("/v1/domains/%d/pvdrm", domid), body, http.StatusAccepted); err != nil {
		destroy("no pvdrm back end")
		return &exitError{code: exitFailure, err: err}
	}
	stopBack := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := controlCall(sctx, socket, http.MethodDelete, fmt.Sprintf("/v1/domains/%d/pvdrm", domid), nil, http.StatusOK); err != nil {
			log.Debug("stop the pvdrm back end", "err", err)
		}
	}
	say("pvdrm back end waiting for domain %d's front end (in the guest: gpuvm guest --mode %s)", domid, rec.Mode)
	if _, err := exec.CommandContext(ctx, c.String("xl"), "unpause", strconv.FormatUint(uint64(domid), 10)).CombinedOutput(); err != nil {
		stopBack()
		destroy("unpause failed")
		return &exitError{code: exitFailure, err: fmt.Errorf("xl unpause %d: %w", domid, err)}
	}
	say("domain %d running (%.1fs after xl create); watching it until it goes", domid, time.Since(t0).Seconds())
	err := waitDomainGone(ctx, domid, log)
	stopBack()
	if errors.Is(err, errSignal) {
		destroy(err.Error())
		return nil
	}
	if err != nil {
		destroy(err.Error())
		return &exitError{code: exitFailure, err: err}
	}
	say("domain %d is gone; its pvdrm back end stopped", domid)
	return nil
}

// errSignal is how waitDomainGone says a signal asked to stop.
var errSignal = errors.New("signal")

// waitDomainGone blocks until domain domid is gone (goneAfter looks in a
// row find its xenstore directory gone, which the toolstack removes as it
// destroys it; nil) or SIGINT/SIGTERM (errSignal). (A dm_op, which
// serveDomain also tries, fails on a PV domain.)
func waitDomainGone(ctx context.Context, domid uint32, log *slog.Logger) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	xs, err := xenstore.Open()
	if err != nil {
		return fmt.Errorf("xenstore: %w", err)
	}
	defer xs.Close()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	key := fmt.Sprintf("/local/domain/%d/domid", domid)
	for misses := 0; ; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case s := <-sigs:
			return fmt.Errorf("%w %v", errSignal, s)
		case <-t.C:
		}
		if _, err := xs.Read(ctx, key); !errors.Is(err, fs.ErrNotExist) {
			misses = 0
			continue
		}
		if misses++; misses >= goneAfter {
			return nil
		}
		log.Warn("domain looks gone; looking again", "domid", domid, "look", misses)
	}
}

// controlCall makes one control API request and wants status back.
func controlCall(ctx context.Context, socket, method, path string, body []byte, want int) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://aggregator"+path, rd)
	if err != nil {
		return err
	}
	resp, err := controlClient(socket).Do(req)
	if err != nil {
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve --xen", "--control-socket")
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// putDomainSettings registers the vGPU settings of domid with the
// aggregator through its control API.
func putDomainSettings(ctx context.Context, socket string, domid uint32, s aggregator.DomainSettings) error {
	body, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := controlCall(ctx, socket, http.MethodPut, "/v1/domains/"+strconv.FormatUint(uint64(domid), 10), body, http.StatusOK); err != nil {
		return fmt.Errorf("register the vGPU settings of domain %d: %w", domid, err)
	}
	return nil
}

// parseBars parses "MEM[,PORT]".
func parseBars(s string) (mem, io uint64, err error) {
	a, b, _ := strings.Cut(s, ",")
	if mem, err = strconv.ParseUint(strings.TrimSpace(a), 0, 64); err != nil || mem == 0 {
		return 0, 0, fmt.Errorf("%q: want a guest-physical address, then optionally a port", s)
	}
	if b != "" {
		if io, err = strconv.ParseUint(strings.TrimSpace(b), 0, 16); err != nil || io == 0 {
			return 0, 0, fmt.Errorf("%q: port %q: want 1..0xffff", s, b)
		}
	}
	return mem, io, nil
}

// barsArg is the gpuvm guest arguments for placements: --bars
// BAR0,BAR1,BAR3[,IOPORT] and the aperture sizes.
func barsArg(ps []devmodel.BARPlacement) string {
	byIndex := map[int]devmodel.BARPlacement{}
	for _, p := range ps {
		byIndex[p.Index] = p
	}
	s := fmt.Sprintf("%#x,%#x,%#x", byIndex[0].Base, byIndex[1].Base, byIndex[3].Base)
	if p, ok := byIndex[5]; ok && p.Enabled {
		s += fmt.Sprintf(",%#x", p.Base)
	}
	// The apertures are the vGPU's slices (as a PCI BAR's size, a power
	// of two), which a guest without config space cannot learn otherwise.
	return s + fmt.Sprintf(" --bar1-size %d --bar3-size %d", byIndex[1].Size, byIndex[3].Size)
}

// xlSay prints a gpuvm xl progress line.
func xlSay(c *cli.Context) func(string, ...any) {
	return func(format string, a ...any) { fmt.Fprintf(c.App.ErrWriter, "gpuvm xl: "+format+"\n", a...) }
}

// runXL runs the xl program (--xl) and returns its output.
func runXL(ctx context.Context, c *cli.Context, a ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, c.String("xl"), a...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", c.String("xl"), strings.Join(a, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// xlDestroyer destroys domain domid, saying why.
func xlDestroyer(c *cli.Context, domid uint32, say func(string, ...any)) func(string) {
	return func(why string) {
		say("destroying domain %d (%s)", domid, why)
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := runXL(dctx, c, "destroy", strconv.FormatUint(uint64(domid), 10)); err != nil {
			say("%v", err)
		}
	}
}
