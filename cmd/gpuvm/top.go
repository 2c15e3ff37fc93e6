package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
)

func topCommand() *cli.Command {
	return &cli.Command{
		Name:  "top",
		Usage: "a live view of the vGPUs: share against weight, GPU time, queue wait, trap rate, state",
		Description: "Polls the aggregator's control API every --interval and shows one line per vGPU,\n" +
			"like xentop or nvidia-smi:\n" +
			"  SHARE     its part of all VMs' GPU time over the last second (on its board)\n" +
			"  ENTITLED  its weight's part of the weights of the VMs on its board (what a fair\n" +
			"            scheduler gives it when every VM computes)\n" +
			"  BOARD     on a host of several boards, the board it is on\n" +
			"  GPU       its GPU time over the interval, as a fraction of the interval\n" +
			"  GPU-TIME  its total GPU time;  QWAIT  mean doorbell-to-release wait over the interval\n" +
			"  TRAPS/s   trapped BAR accesses per second;  VRAM  what its slot holds / its size\n" +
			"  STATE     computing, queued or idle.\n" +
			"On a terminal the view refreshes in place until interrupted; otherwise (a pipe, a\n" +
			"file) each refresh is printed after the last, with a time stamp.",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "control-socket", Value: config.Default().Daemon.ControlSocket, Usage: "the aggregator's control socket"},
			&cli.DurationFlag{Name: "interval", Aliases: []string{"d"}, Value: time.Second, Usage: "time between refreshes"},
			&cli.IntFlag{Name: "iterations", Aliases: []string{"n"}, Usage: "stop after this many refreshes (0: until interrupted)"},
		},
		Action: runTop,
	}
}

// topSample is one poll of the control API.
type topSample struct {
	at    time.Time
	vgpus []aggregator.VGPUInfo
	slots int
}

func runTop(c *cli.Context) error {
	interval := c.Duration("interval")
	if interval < 100*time.Millisecond {
		return usageHint(c, "--interval %v: want at least 100ms", interval)
	}
	if c.Int("iterations") < 0 {
		return usageHint(c, "--iterations %d: want 0 or more", c.Int("iterations"))
	}
	socket := c.Path("control-socket")
	poll := func() (topSample, error) {
		s := topSample{}
		var layout aggregator.Layout
		if err := controlGet(c.Context, socket, "/v1/layout", &layout); err != nil {
			return s, err
		}
		if err := controlGet(c.Context, socket, "/v1/vgpus", &s.vgpus); err != nil {
			return s, err
		}
		s.at, s.slots = time.Now(), len(layout.Slots)
		return s, nil
	}
	tty := isTerminal(c.App.Writer)
	prev, err := poll()
	if err != nil {
		return err
	}
	for n := 1; ; n++ {
		select {
		case <-c.Context.Done():
			return nil
		case <-time.After(interval):
		}
		cur, err := poll()
		if err != nil {
			return err
		}
		if tty {
			fmt.Fprint(c.App.Writer, "\x1b[H\x1b[2J") // home, clear
		} else if n > 1 {
			fmt.Fprintln(c.App.Writer)
		}
		if err := renderTop(c.App.Writer, prev, cur); err != nil {
			return err
		}
		prev = cur
		if k := c.Int("iterations"); k > 0 && n >= k {
			return nil
		}
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// renderTop writes the view of cur, with rates over the time since prev.
func renderTop(w io.Writer, prev, cur topSample) error {
	dt := cur.at.Sub(prev.at)
	before := map[int]aggregator.VGPUInfo{}
	for _, v := range prev.vgpus {
		before[v.ID] = v
	}
	// Each board has its own scheduler: entitlement and busy time are per
	// board.
	weights, busy := map[int]int{}, map[int]float64{}
	boardName := map[int]string{}
	for _, v := range cur.vgpus {
		weights[v.Board] += max(v.Sched.Weight, 1)
		busy[v.Board] += v.Sched.Busy
		boardName[v.Board] = cmp.Or(v.BoardName, strconv.Itoa(v.Board))
	}
	vgpus := append([]aggregator.VGPUInfo(nil), cur.vgpus...)
	sort.Slice(vgpus, func(i, j int) bool { return vgpus[i].ID < vgpus[j].ID })
	several := len(boardName) > 1
	if several {
		var parts []string
		for _, b := range slices.Sorted(maps.Keys(boardName)) {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", boardName[b], 100*min(busy[b], 1)))
		}
		fmt.Fprintf(w, "gpuvm top - %s  vGPUs %d/%d  GPU busy %s (last second)  interval %.1fs\n\n",
			cur.at.Format("15:04:05"), len(vgpus), cur.slots, strings.Join(parts, ", "), dt.Seconds())
	} else {
		var all float64
		for _, b := range busy {
			all += b
		}
		fmt.Fprintf(w, "gpuvm top - %s  vGPUs %d/%d  GPU busy %.0f%% (last second)  interval %.1fs\n\n",
			cur.at.Format("15:04:05"), len(vgpus), cur.slots, 100*min(all, 1), dt.Seconds())
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	boardCol := func(v aggregator.VGPUInfo) string {
		if !several {
			return ""
		}
		return boardName[v.Board] + "\t"
	}
	if several {
		fmt.Fprint(tw, "VGPU\tBOARD\t")
	} else {
		fmt.Fprint(tw, "VGPU\t")
	}
	fmt.Fprintln(tw, "DOMAIN\tDOMID\tMODE\tPROFILE\tWEIGHT\tSHARE\tENTITLED\tGPU\tGPU-TIME\tQWAIT\tQUEUED\tTRAPS/s\tVRAM\tSTATE\t")
	for _, v := range vgpus {
		p, seen := before[v.ID]
		if seen && (p.DomID != v.DomID || p.Name != v.Name || p.PID != v.PID ||
			v.Sched.GPUTime < p.Sched.GPUTime || v.Sched.Released < p.Sched.Released || trapCount(v.Counters) < trapCount(p.Counters)) {
			seen = false // another VM, or the same one attached afresh, took the slot
		}
		var gpu, qwait, traps float64
		if seen && dt > 0 {
			gpu = float64(v.Sched.GPUTime-p.Sched.GPUTime) / float64(dt)
			if n := v.Sched.Released - p.Sched.Released; n > 0 {
				qwait = float64(v.Sched.QueueWait-p.Sched.QueueWait) / float64(n)
			}
			traps = float64(trapCount(v.Counters)-trapCount(p.Counters)) / dt.Seconds()
		}
		state := "idle"
		switch {
		case v.Sched.Queued > 0:
			state = "queued"
		case gpu > 0 || v.Sched.Busy > 0:
			state = "computing"
		}
		profile := v.Profile
		if profile == "" {
			profile = "-"
		}
		vram := "-"
		if v.VRAMInUse >= 0 {
			vram = config.Size(v.VRAMInUse&^0x3FF).String() + "/" + config.Size(v.VRAMBytes).String()
		}
		fmt.Fprintf(tw, "%d\t%s%s\t%d\t%s\t%s\t%d\t%.1f%%\t%.1f%%\t%.1f%%\t%s\t%s\t%d\t%.0f\t%s\t%s\t\n",
			v.ID, boardCol(v), v.Name, v.DomID, v.Mode, profile, v.Sched.Weight, 100*v.Sched.Share,
			100*float64(max(v.Sched.Weight, 1))/float64(weights[v.Board]), 100*gpu,
			v.Sched.GPUTime.Round(time.Millisecond), time.Duration(qwait).Round(time.Microsecond),
			v.Sched.Queued, traps, vram, state)
	}
	if len(vgpus) == 0 {
		fmt.Fprintln(tw, "(no vGPUs attached)")
	}
	return tw.Flush()
}

// trapCount sums a vGPU's trapped BAR accesses from its control-API
// counters (barN_traps: {"read": r, "write": w}).
func trapCount(counters map[string]any) uint64 {
	var n uint64
	for k, v := range counters {
		m, ok := v.(map[string]any)
		if !ok || !strings.HasSuffix(k, "_traps") {
			continue
		}
		for _, x := range m {
			if f, ok := x.(float64); ok {
				n += uint64(f)
			}
		}
	}
	return n
}
