package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/pvdrm"
)

// runGuestPVDRM is gpuvm guest in a pvdrm mode: the front end over the xen
// transport (the ring and the GART heap granted to dom0, an event channel,
// the xenbus handshake with the back end gpuvm serve --xen runs), the
// workloads on it, and the ring's measured round trip.
func runGuestPVDRM(c *cli.Context, f *guestFlags) (err error) {
	ctx := c.Context
	dctx, cancel := context.WithTimeout(ctx, c.Duration("connect-timeout"))
	defer cancel()
	if c.Duration("resume-timeout") < 0 {
		return usageError("--resume-timeout %v: want 0 (off) or more", c.Duration("resume-timeout"))
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	fe, err := pvdrm.DialXen(dctx, pvdrm.XenDialConfig{DevID: uint32(c.Uint("devid")), Mode: f.mode, GARTSize: f.gartSize, DevDir: c.Path("xen-dir"),
		ResumeTimeout: c.Duration("resume-timeout"), Logger: log})
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("pvdrm front end: %w", err)}
	}
	defer func() { err = errors.Join(err, fe.Close()) }()
	w := fe.Welcome()
	fmt.Fprintf(c.App.ErrWriter, "guest: pvdrm front end connected: vGPU %d, %d MiB VRAM, %d channels, %d MiB GART heap granted\n",
		w.VGPU, w.VRAMSize>>20, w.Channels, f.gartSize>>20)
	var rtt time.Duration
	if f.roundTrips > 0 {
		if rtt, err = pvdrmRingRoundTrip(ctx, fe, f.roundTrips); err != nil {
			return &exitError{code: exitFailure, err: err}
		}
		fmt.Fprintf(c.App.ErrWriter, "guest: pvdrm ring round trip (GETPARAM, through Xen's event channels): mean %s over %d\n", bench.FormatDuration(rtt.Nanoseconds()), f.roundTrips)
	}
	counters := func() map[string]uint64 {
		st := fe.Client.Stats()
		return map[string]uint64{"front_requests": st.Requests, "front_notifications": st.Notifications, "front_maps": fe.Shares.Mappings()}
	}
	board := bench.VGPUBoardInfo(w, f.mode)
	board.Kind, board.Timing = "in a Xen guest, "+f.mode, "real (each request a ring slot and an event channel kick)"
	rep := bench.Report{Warmup: 1, Board: board}
	progress := newProgress(c.App.ErrWriter)
	drv := gdev.PVDRM(fe.Client, fe.Shares)
	for _, wl := range f.work {
		res := bench.RunWorkload(ctx, f.mode, drv, wl, f.runs, counters, progress.update)
		if rtt > 0 {
			res.Counters["ring_round_trip_ns"] = rtt.Nanoseconds()
		}
		rep.Results = append(rep.Results, res)
	}
	progress.done()
	return writeGuestReport(c, rep)
}

// pvdrmRingRoundTrip times n GETPARAM requests on a file of their own.
func pvdrmRingRoundTrip(ctx context.Context, fe *pvdrm.FrontEnd, n int) (time.Duration, error) {
	rsp, err := fe.Client.Do(ctx, pvdrm.Request{Op: pvdrm.OpOpen})
	if err != nil {
		return 0, fmt.Errorf("pvdrm open: %w", err)
	}
	file := uint32(rsp.Results["file"])
	ring, _, err := fe.RoundTrips(ctx, file, n)
	_, cerr := fe.Client.Do(ctx, pvdrm.Request{Op: pvdrm.OpClose, File: file})
	return ring, errors.Join(err, cerr)
}
