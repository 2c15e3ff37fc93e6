package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// xlFrontEndLetGo bounds the wait for a pvdrm domain's front end to let go
// of its event channel once its vGPU was saved (it looks every 100 ms).
const xlFrontEndLetGo = 30 * time.Second

// runXLSavePVDRM saves pvdrm domain domid (its vGPU id on the daemon) to
// file: the vGPU first, while the guest runs — parked at a request
// boundary, its image on disk, its back end gone with the device marked
// saved — then, once the guest's front end let go of its event channel
// (its state Initialising), the domain (xl save -p), which is then
// destroyed. Until xl save succeeded, a failure gives the image back to
// the daemon for the same domain: its front end resumes on it.
func runXLSavePVDRM(c *cli.Context, xs *xenstore.Client, domid uint32, id int, rec xlSaveRecord, file string, t0 time.Time) error {
	ctx, say := c.Context, xlSay(c)
	imgFile, recFile := xlSideFiles(file)
	if err := writeXLRecord(recFile, rec); err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("the domain's record: %w", err)}
	}
	if err := saveImage(c, "http://aggregator/v1/vgpus/"+strconv.Itoa(id)+"/save", imgFile, false); err != nil {
		os.Remove(recFile)
		return err
	}
	say("vGPU %d saved to %s in %.2fs; waiting for domain %d's front end to let go", id, imgFile, time.Since(t0).Seconds(), domid)
	giveBack := func(err error) error {
		rctx := context.WithoutCancel(ctx)
		if rerr := restoreImage(rctx, c.Path("control-socket"), domid, imgFile, io.Discard); rerr != nil {
			err = errors.Join(err, fmt.Errorf("giving the vGPU back to domain %d: %w (its image stays in %s: gpuvm vgpu restore --domid %d %s)", domid, rerr, imgFile, domid, imgFile))
		} else {
			say("vGPU given back to domain %d: its front end resumes on it", domid)
			os.Remove(imgFile)
		}
		os.Remove(file)
		os.Remove(recFile)
		return &exitError{code: exitFailure, err: err}
	}
	if err := waitFrontEndLetGo(ctx, xs, domid, xlFrontEndLetGo); errors.Is(err, errFrontEndLeft) {
		// Nothing waits for the image in the guest: the domain goes on,
		// and its next front end gets a fresh vGPU.
		os.Remove(file)
		os.Remove(recFile)
		return &exitError{code: exitFailure, err: fmt.Errorf("%w; domain %d goes on without it, and its vGPU's state stays in %s", err, domid, imgFile)}
	} else if err != nil {
		return giveBack(err)
	}
	t1 := time.Now()
	if _, err := runXL(ctx, c, "save", "-p", strconv.FormatUint(uint64(domid), 10), file); err != nil {
		if _, uerr := runXL(context.WithoutCancel(ctx), c, "unpause", strconv.FormatUint(uint64(domid), 10)); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return giveBack(err)
	}
	say("domain %d suspended and its memory saved to %s (%.1fs)", domid, file, time.Since(t1).Seconds())
	return xlDestroySaved(c, domid, file, t0)
}

// errFrontEndLeft says a pvdrm front end ended with its vGPU's save
// instead of waiting for its restore.
var errFrontEndLeft = errors.New("the pvdrm front end ended with the save instead of waiting for the restore (gpuvm guest --resume-timeout 0?)")

// waitFrontEndLetGo waits until domain domid's pvdrm front end (device 0)
// announces Initialising: after its back end saved the vGPU, it closed its
// event channel and waits for a restore. A front end that closes instead
// fails it at once (errFrontEndLeft).
func waitFrontEndLetGo(ctx context.Context, xs *xenstore.Client, domid uint32, within time.Duration) error {
	key := xenbus.Device{Type: pvdrm.XenDeviceType, FrontDomid: uint16(domid)}.FrontendPath() + "/state"
	want := strconv.Itoa(int(xenbus.StateInitialising))
	deadline := time.Now().Add(within)
	var last string
	for {
		v, err := xs.Read(ctx, key)
		if err == nil && v == want {
			return nil
		}
		if err == nil && (v == strconv.Itoa(int(xenbus.StateClosing)) || v == strconv.Itoa(int(xenbus.StateClosed))) {
			return errFrontEndLeft
		}
		last = v
		if err != nil {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("domain %d's pvdrm front end did not let go of its event channel within %v (its state: %s); is it gpuvm guest with a --resume-timeout?", domid, within, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
