package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/xen/privcmd"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// Saving and restoring a Xen domain with its vGPU (issue 18). xl saves a
// domain's memory and config; gpuvm xl save adds the vGPU's state image
// and how its device model served it, and gpuvm xl restore brings all
// three back (docs/design.md, "xl save and restore").

// xlRecordVersion is the version of xlSaveRecord this gpuvm writes.
const xlRecordVersion = 1

// xlSaveRecord is how a domain's device model serves its vGPU: what gpuvm
// xl restore needs besides the domain's memory (xl's save file) and the
// vGPU's state image. A running device model keeps it in xenstore
// (xlRecordPath), its BAR placements current; gpuvm xl save writes it
// beside the save file.
type xlSaveRecord struct {
	Version    int                       `json:"version"`
	Name       string                    `json:"name"`
	Type       string                    `json:"type"` // xl's: hvm or pvh (pvdrm modes: pv too)
	Mode       string                    `json:"mode"`
	RAMSpan    uint64                    `json:"ram_span,omitempty"` // guest-physical bytes the aggregator maps (not pvdrm)
	PCI        string                    `json:"pci,omitempty"`      // the vGPU's function in the guest (not pvdrm)
	Settings   aggregator.DomainSettings `json:"settings"`
	Placements []devmodel.BARPlacement   `json:"placements"`
}

// xlRecordPath is where domain domid's device model keeps its record:
// beside the device-model directory libxl keeps (and removes) for it.
func xlRecordPath(domid uint32) string {
	return fmt.Sprintf("/local/domain/0/device-model/%d/gpuvm", domid)
}

func publishXLRecord(ctx context.Context, xs *xenstore.Client, domid uint32, rec xlSaveRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return xs.Write(ctx, xlRecordPath(domid), string(b))
}

// check validates a record read back from a file: it names what a device
// model could serve.
func (r *xlSaveRecord) check() error {
	mode := config.Mode(r.Mode)
	switch {
	case r.Version != xlRecordVersion:
		return fmt.Errorf("record version %d: this gpuvm reads %d", r.Version, xlRecordVersion)
	case r.Name == "":
		return errors.New("no domain name")
	case !mode.Valid():
		return fmt.Errorf("mode %q: not one gpuvm serves", r.Mode)
	case mode.IsPVDRM():
		// No device model: the daemon serves the pvdrm device.
		if r.Type != "pv" && r.Type != "pvh" && r.Type != "hvm" {
			return fmt.Errorf("domain type %q: want pv, pvh or hvm", r.Type)
		}
		if r.RAMSpan != 0 || r.PCI != "" || len(r.Placements) != 0 {
			return errors.New("a pvdrm domain's record names a device model's RAM span, PCI function or BARs")
		}
		return nil
	case r.RAMSpan == 0 || r.RAMSpan > 1<<40:
		return fmt.Errorf("RAM span %d: not a domain's", r.RAMSpan)
	case r.Type != "hvm" && r.Type != "pvh":
		return fmt.Errorf("domain type %q: want hvm or pvh", r.Type)
	}
	if _, err := privcmd.ParseSBDF(r.PCI); err != nil {
		return fmt.Errorf("pci %q: %w", r.PCI, err)
	}
	return nil
}

// xlSideFiles are the files gpuvm xl save writes beside xl's save file.
func xlSideFiles(file string) (image, record string) { return file + ".vgpu", file + ".gpuvm" }

func xlDaemonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.PathFlag{Name: "socket", Value: config.Default().Daemon.Socket, Usage: "the aggregator's device-model socket"},
		&cli.PathFlag{Name: "control-socket", Value: config.Default().Daemon.ControlSocket, Usage: "the aggregator's control socket"},
		&cli.StringFlag{Name: "xl", Value: "xl", Usage: "the xl program"},
		&cli.PathFlag{Name: "xen-dir", Value: "/dev/xen", Usage: "where privcmd and evtchn are"},
		&cli.IntFlag{Name: "ipc-spin", Usage: "polls of the aggregator connection before sleeping (0: never; a spinning dom0 vCPU holds the CPU the trapped guest waits for)"},
	}
}

// xlResumeFlag is the device model's wait across a daemon handoff
// (gpuvm xl create and restore serve one).
func xlResumeFlag() cli.Flag {
	return &cli.DurationFlag{Name: "resume-timeout", Value: defaultResumeTimeout, Usage: "when gpuvm serve hands off to a new process of itself (systemctl reload gpuvm), keep the domain's device and wait this long for the new process to give its vGPU back; the guest's accesses wait meanwhile (docs/protocol.md §15). 0: the device model ends with the connection, and the daemon refuses to hand off while it serves"}
}

func xlSaveCommand() *cli.Command {
	return &cli.Command{
		Name:      "save",
		Usage:     "save a domain with its vGPU: xl save, and the vGPU's state beside it",
		ArgsUsage: "DOMAIN FILE",
		Description: "Saves DOMAIN (a name or id, created by gpuvm xl create) to FILE with its vGPU:\n" +
			"  1. xl save -p DOMAIN FILE: the guest suspends, xl writes its memory and config to\n" +
			"     FILE, and leaves the domain paused (not destroyed);\n" +
			"  2. the vGPU, untouched by a guest that no longer runs, is saved as a state image to\n" +
			"     FILE.vgpu (as gpuvm vgpu save does: parked, checked, on disk before it is destroyed),\n" +
			"     and how its device model served it (mode, PCI function, BAR placements) to\n" +
			"     FILE.gpuvm;\n" +
			"  3. the domain is destroyed; its device model (gpuvm xl create) ends.\n" +
			"A failure before the vGPU's image is on disk unpauses the domain — its guest resumes as\n" +
			"from a cancelled suspend, with its vGPU — and removes FILE. gpuvm xl restore FILE\n" +
			"brings the domain back, here or on another host.\n" +
			"A pvdrm domain (no device model) goes the other way round: its vGPU is saved first, at a\n" +
			"request boundary, while the guest runs; its front end (gpuvm guest --resume-timeout) lets\n" +
			"go of its event channel and waits, its requests on the ring; then xl save -p. If the front\n" +
			"end does not let go, or xl save fails, the image is given back to the daemon for the same\n" +
			"domain, which goes on with its vGPU (docs/pvdrm.md §8, A device across a save).\n\n" +
			"Exit status: 0 once the three files are written and the domain is gone; 1 on failure;\n" +
			"2 for bad arguments.",
		Flags:  xlDaemonFlags(),
		Action: runXLSave,
	}
}

func runXLSave(c *cli.Context) error {
	args := positional(c)
	if len(args) != 2 {
		return usageHint(c, "want a domain and a file (gpuvm xl save DOMAIN FILE), got %d arguments", len(args))
	}
	ctx, say, file := c.Context, xlSay(c), args[1]
	imgFile, recFile := xlSideFiles(file)
	t0 := time.Now()
	domid, err := xlDomID(ctx, c, args[0])
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	xs, err := xenstore.Open()
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("xenstore: %w", err)}
	}
	defer xs.Close()
	raw, err := xs.Read(ctx, xlRecordPath(domid))
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("domain %d has no gpuvm device model (is it one gpuvm xl create started?): %w", domid, err)}
	}
	var rec xlSaveRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("domain %d's device model record: %w", domid, err)}
	}
	var vgpus []aggregator.VGPUInfo
	if err := controlGet(ctx, c.Path("control-socket"), "/v1/vgpus", &vgpus); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	id := -1
	for _, v := range vgpus {
		if v.DomID == domid {
			id = v.ID
		}
	}
	if id < 0 {
		return &exitError{code: exitFailure, err: fmt.Errorf("domain %d has no vGPU on the daemon", domid)}
	}
	if config.Mode(rec.Mode).IsPVDRM() {
		return runXLSavePVDRM(c, xs, domid, id, rec, file, t0)
	}
	if _, err := runXL(ctx, c, "save", "-p", strconv.FormatUint(uint64(domid), 10), file); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	say("domain %d suspended and its memory saved to %s (%.1fs); it waits, paused", domid, file, time.Since(t0).Seconds())
	undo := func(err error) error {
		os.Remove(file)
		os.Remove(recFile)
		if _, uerr := runXL(context.WithoutCancel(ctx), c, "unpause", strconv.FormatUint(uint64(domid), 10)); uerr != nil {
			err = errors.Join(err, uerr)
		} else {
			say("domain %d unpaused: it goes on with its vGPU, and %s is removed", domid, file)
		}
		return &exitError{code: exitFailure, err: err}
	}
	if err := writeXLRecord(recFile, rec); err != nil {
		return undo(fmt.Errorf("the device model record: %w", err))
	}
	t1 := time.Now()
	if err := saveImage(c, "http://aggregator/v1/vgpus/"+strconv.Itoa(id)+"/save", imgFile, false); err != nil {
		return undo(err)
	}
	say("vGPU %d saved to %s in %.2fs", id, imgFile, time.Since(t1).Seconds())
	return xlDestroySaved(c, domid, file, t0)
}

// writeXLRecord writes rec to file, on disk before it is in place.
func writeXLRecord(file string, rec xlSaveRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return writeFileSync(file, append(b, '\n'))
}

// xlDestroySaved destroys domain domid once it and its vGPU are saved to
// file (the save began at t0).
func xlDestroySaved(c *cli.Context, domid uint32, file string, t0 time.Time) error {
	if _, err := runXL(c.Context, c, "destroy", strconv.FormatUint(uint64(domid), 10)); err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("the domain and its vGPU are saved, but: %w", err)}
	}
	xlSay(c)("domain %d saved with its vGPU in %.1fs: gpuvm xl restore %s", domid, time.Since(t0).Seconds(), file)
	return nil
}

// writeFileSync writes b to file through a temporary file, on disk before
// it is renamed into place.
func writeFileSync(file string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// xlDomID is the id of domain dom, a name or a number.
func xlDomID(ctx context.Context, c *cli.Context, dom string) (uint32, error) {
	out := dom
	if _, err := strconv.ParseUint(dom, 10, 32); err != nil {
		if out, err = runXL(ctx, c, "domid", dom); err != nil {
			return 0, err
		}
	}
	id, err := strconv.ParseUint(out, 10, 32)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("domain %q: id %q is not a guest's", dom, out)
	}
	return uint32(id), nil
}

func xlRestoreCommand() *cli.Command {
	return &cli.Command{
		Name:      "restore",
		Usage:     "restore a domain gpuvm xl save saved, with its vGPU",
		ArgsUsage: "FILE",
		Description: "Reads FILE.gpuvm (how the saved domain's device model served its vGPU), then:\n" +
			"  1. xl restore -p FILE: the domain comes back paused, under a new id;\n" +
			"  2. gives FILE.vgpu, the vGPU's state image, to the daemon for the new domain (checked\n" +
			"     whole, as gpuvm vgpu restore does);\n" +
			"  3. starts the domain's device model with a resuming Hello, its BARs where the guest\n" +
			"     had them: the daemon restores the vGPU into a slot before it welcomes it;\n" +
			"  4. unpauses the domain and serves it in the foreground, as gpuvm xl create does.\n" +
			"The guest's driver and its work go on where the save left them. Any failure destroys the\n" +
			"new domain; FILE and its side files stay for another try.\n\n" +
			"Exit status as gpuvm xl create: 0 when the domain goes; 1 on failure; 2 for bad arguments.",
		Flags:  append(xlDaemonFlags(), xlResumeFlag()),
		Action: runXLRestore,
	}
}

func runXLRestore(c *cli.Context) error {
	args := positional(c)
	if len(args) != 1 {
		return usageHint(c, "want the file gpuvm xl save wrote, got %d arguments", len(args))
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	ctx, say, file := c.Context, xlSay(c), args[0]
	imgFile, recFile := xlSideFiles(file)
	b, err := os.ReadFile(recFile)
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("%w (gpuvm xl save writes it beside %s)", err, file)}
	}
	var rec xlSaveRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("%s: %w", recFile, err)}
	}
	if err := rec.check(); err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("%s: %w", recFile, err)}
	}
	if _, err := os.Stat(imgFile); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	sbdf, _ := privcmd.ParseSBDF(rec.PCI) // checked
	t0 := time.Now()
	if _, err := runXL(ctx, c, "restore", "-p", file); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	domid, err := xlDomID(ctx, c, rec.Name)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	destroy := xlDestroyer(c, domid, say)
	say("domain %s restored as %d (paused) in %.1fs", rec.Name, domid, time.Since(t0).Seconds())
	if err := putDomainSettings(ctx, c.Path("control-socket"), domid, rec.Settings); err != nil {
		destroy("the vGPU settings were not registered")
		return &exitError{code: exitFailure, err: err}
	}
	if err := restoreImage(ctx, c.Path("control-socket"), domid, imgFile, io.Discard); err != nil {
		destroy("the vGPU's image was refused")
		return err
	}
	if config.Mode(rec.Mode).IsPVDRM() {
		// The daemon's pvdrm back end offers the device to resume: the
		// guest's front end grants its ring again, and the image gives it
		// its vGPU back.
		return runXLPVDRM(ctx, c, rec, domid, t0, say, destroy, log)
	}
	st := xenVGPUStart{sbdf: sbdf, resume: true, placements: rec.Placements}
	return serveXenVGPU(ctx, c, rec, domid, st, t0, say, destroy, log)
}
