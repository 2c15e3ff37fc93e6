package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/sched"
)

// CovertOptions configure the covert-channel harness.
type CovertOptions struct {
	Board    sim.Config
	Policies []string
	// Bit is the bit period; Bits the message length after the preamble,
	// Preamble the number of alternating calibration bits (1010...).
	Bit      time.Duration
	Bits     int
	Preamble int
	// Seed makes the message: the same seed, the same bits.
	Seed uint64
	// SendIterations sizes the sender's busy kernel, ProbeIterations the
	// receiver's probe (loop-kernel iterations).
	SendIterations  uint64
	ProbeIterations uint64
	// CPUSender replaces the sender's GPU load with a CPU load of its own
	// (CovertGuestOptions.CPUOnly): a control for what leaks through the
	// host rather than the GPU.
	CPUSender bool
	// Lead is the time from both VMs being set up to the agreed start of
	// bit 0, which the harness then announces to both.
	Lead     time.Duration
	Sched    sched.Params
	Watchdog time.Duration
	// ServerSpin is the aggregator's IPC spin budget per VM connection
	// (ipc.ListenOptions.Spin; 0: the package default, negative: never).
	ServerSpin int
	Command    VMCommand
	Progress   func(msg string)
	Logger     *slog.Logger
}

// LatencyStats summarises probe latencies, in µs.
type LatencyStats struct {
	Count    int     `json:"count"`
	MeanUs   float64 `json:"mean_us"`
	MedianUs float64 `json:"median_us"`
	P95Us    float64 `json:"p95_us"`
}

// CovertPeriod is one bit period as the receiver saw it.
type CovertPeriod struct {
	Sent    int `json:"sent"`    // 0 or 1
	Decoded int `json:"decoded"` // 0 or 1
	// Probes is the number of probes submitted in the period's decision
	// window, MeanUs their mean latency (the decoder's statistic) and
	// MedianUs their median (both 0 with no probe).
	Probes   int     `json:"probes"`
	MeanUs   float64 `json:"mean_us"`
	MedianUs float64 `json:"median_us"`
}

// Overrun sums how far submissions of one VM ran past the end of the
// strict slot they were released in.
type Overrun struct {
	Count   int     `json:"count"`
	TotalMs float64 `json:"total_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// CovertRun is one policy's measurement.
type CovertRun struct {
	Policy string `json:"policy"`
	// BitsPerSec is the raw bit rate (1 / bit period); Errors of Bits
	// message bits were decoded wrong, BER = Errors / Bits; CapacityBps is
	// the binary symmetric channel's capacity BitsPerSec × (1 − H2(BER)).
	BitsPerSec  float64 `json:"bits_per_sec"`
	Bits        int     `json:"bits"`
	Errors      int     `json:"errors"`
	BER         float64 `json:"ber"`
	CapacityBps float64 `json:"capacity_bps"`
	// ThresholdUs is the decision threshold the preamble calibrated;
	// Inverted says 1-bits showed lower latencies than 0-bits in it.
	ThresholdUs float64 `json:"threshold_us"`
	Inverted    bool    `json:"inverted,omitempty"`
	// Latency0 and Latency1 summarise the latencies of the probes in the
	// message's 0-bit and 1-bit periods (decision windows).
	Latency0 LatencyStats `json:"latency_0"`
	Latency1 LatencyStats `json:"latency_1"`
	// EmptyPeriods had no probe in their decision window (decoded as 0).
	EmptyPeriods int `json:"empty_periods"`
	// SenderKernelsPerSec is the sender's kernels per second of 1-bit
	// time, ProbesPerSec the receiver's probes per second: the throughput
	// each VM got.
	SenderKernelsPerSec float64 `json:"sender_kernels_per_sec"`
	SenderKernelUs      float64 `json:"sender_kernel_us"`
	ProbesPerSec        float64 `json:"probes_per_sec"`
	// GPUBusy is the fraction of the message's time the GPU executed
	// submissions.
	GPUBusy float64 `json:"gpu_busy"`
	// SenderOverrun (strict only) is how far the sender's submissions ran
	// into the receiver's slots: the channel strict leaves open.
	SenderOverrun *Overrun       `json:"sender_overrun,omitempty"`
	Periods       []CovertPeriod `json:"periods"`
}

// CovertReport is the covert-channel harness' whole output.
type CovertReport struct {
	Board            BoardInfo   `json:"board"`
	BitPeriodNs      int64       `json:"bit_period_ns"`
	Preamble         int         `json:"preamble"`
	Bits             int         `json:"bits"`
	Seed             uint64      `json:"seed"`
	SendIterations   uint64      `json:"send_iterations"`
	ProbeIterations  uint64      `json:"probe_iterations"`
	CPUSender        bool        `json:"cpu_sender,omitempty"`
	TimesliceNs      int64       `json:"timeslice_ns"`
	WatchdogNs       int64       `json:"watchdog_ns"`
	DecisionWindowNs int64       `json:"decision_window_ns"`
	Runs             []CovertRun `json:"runs"`
}

// CovertMessage returns the harness' bit string: preamble alternating bits
// (1010...) and then bits pseudo-random bits drawn from seed.
func CovertMessage(preamble, bits int, seed uint64) string {
	var b strings.Builder
	for i := range preamble {
		b.WriteByte("10"[i%2])
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for range bits {
		b.WriteByte('0' + byte(r.IntN(2)))
	}
	return b.String()
}

// RunCovert measures, per policy, the GPU timing channel between two VMs:
// a fresh board and aggregator with that policy serve a sender VM and a
// receiver VM (each a `gpuvm devmodel` process over the real protocol);
// the sender encodes CovertMessage in its GPU load from an agreed start,
// the receiver times its probes, and the harness decodes: it calibrates a
// threshold on the preamble and compares each message bit period's mean
// probe latency with it.
func RunCovert(ctx context.Context, o CovertOptions) (CovertReport, error) {
	rep := CovertReport{Board: BoardInfoFor(o.Board), BitPeriodNs: o.Bit.Nanoseconds(), Preamble: o.Preamble, Bits: o.Bits,
		Seed: o.Seed, SendIterations: o.SendIterations, ProbeIterations: o.ProbeIterations, CPUSender: o.CPUSender,
		DecisionWindowNs: (o.Bit - covertSkip(o.Bit)).Nanoseconds(), WatchdogNs: o.Watchdog.Nanoseconds()}
	rep.TimesliceNs = o.timeslice().Nanoseconds()
	if o.Preamble < 2 || o.Bits < 1 || o.Bit <= 0 {
		return rep, fmt.Errorf("covert: preamble %d (want ≥ 2), %d bits, bit period %v", o.Preamble, o.Bits, o.Bit)
	}
	msg := CovertMessage(o.Preamble, o.Bits, o.Seed)
	for _, pol := range o.Policies {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf("covert: %s, %d bits at %v per bit (%.1fs)", pol, len(msg), o.Bit,
				(time.Duration(len(msg))*o.Bit + o.Lead).Seconds()))
		}
		r, err := runCovertOne(ctx, o, pol, msg)
		if err != nil {
			return rep, fmt.Errorf("covert %s: %w", pol, err)
		}
		if o.Progress != nil {
			o.Progress(fmt.Sprintf("covert: %s: %d/%d bits wrong (BER %.3f), capacity %.2f bits/s", pol, r.Errors, r.Bits, r.BER, r.CapacityBps))
		}
		rep.Runs = append(rep.Runs, r)
	}
	return rep, nil
}

// timeslice is the strict slot length the runs use.
func (o CovertOptions) timeslice() time.Duration {
	if o.Sched.Timeslice > 0 {
		return o.Sched.Timeslice
	}
	return sched.Defaults().Timeslice
}

// covertSkip is the start of each bit period the decoder ignores: the
// sender's last kernel of a 1-bit may still run there.
func covertSkip(bit time.Duration) time.Duration { return bit / 10 }

// runCovertOne runs the sender and the receiver under policy.
func runCovertOne(ctx context.Context, o CovertOptions, policy, msg string) (CovertRun, error) {
	run := CovertRun{Policy: policy, BitsPerSec: 1 / o.Bit.Seconds()}
	p, err := sched.New(policy, o.Sched)
	if err != nil {
		return run, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv, err := serveBoard(ctx, o.Board, aggregator.Options{Partition: fairnessPartition(2), MaxVMs: 2, Policy: p,
		Watchdog: o.Watchdog, Logger: log}, &ipc.ListenOptions{Spin: o.ServerSpin})
	if err != nil {
		return run, err
	}
	defer srv.close()
	srv.agg.StartRecording()
	guests, start, err := runCovertVMs(ctx, o, srv.socket(), msg)
	if err != nil {
		return run, err
	}
	sender, receiver := guests[0], guests[1]
	if err := decodeRun(&run, msg, o.Preamble, o.Bit, receiver); err != nil {
		return run, err
	}
	ones := strings.Count(msg, "1")
	run.SenderKernelsPerSec = float64(sender.Kernels) / (float64(ones) * o.Bit.Seconds())
	run.SenderKernelUs = sender.MeanKernelNs / 1e3
	run.ProbesPerSec = float64(receiver.Kernels) / (float64(len(msg)) * o.Bit.Seconds())
	// The message's time on the dispatcher's clock, which the usage uses.
	usage, now := srv.agg.Recorded()
	from := now - time.Since(start)
	to := from + time.Duration(len(msg))*o.Bit
	run.GPUBusy = gpuBusy(usage, from, to)
	if policy == "strict" {
		ov := slotOverrun(usage, CovertSender, o.timeslice(), from, to)
		run.SenderOverrun = &ov
	}
	return run, nil
}

// runCovertVMs runs the sender and the receiver VM processes against the
// aggregator on socket: it starts both, announces the start of bit 0 Lead
// after both are set up, and returns their summaries (in CovertRoles
// order) and that start.
func runCovertVMs(ctx context.Context, o CovertOptions, socket, msg string) ([]CovertGuest, time.Time, error) {
	vctx, kill := context.WithCancel(ctx)
	roles := CovertRoles()
	vms := make([]*covertVM, 0, len(roles))
	defer func() {
		kill() // the VMs have ended, or they must
		for _, vm := range vms {
			vm.wait()
		}
	}()
	for i, role := range roles {
		iters := o.SendIterations
		if role == CovertReceiver {
			iters = o.ProbeIterations
		}
		args := []string{"devmodel", "--socket", socket, "--mode", "fv-optimized", "--domid", strconv.Itoa(i + 1), "--name", role,
			"--ram", "64MiB", "--covert", role, "--covert-bit", o.Bit.String(), "--loop-iterations", strconv.FormatUint(iters, 10)}
		if role == CovertSender {
			args = append(args, "--covert-message", msg)
			if o.CPUSender {
				args = append(args, "--covert-cpu-only")
			}
		} else {
			args = append(args, "--covert-periods", strconv.Itoa(len(msg)))
		}
		vm, err := startCovertVM(o.Command(vctx, args), role)
		if err != nil {
			return nil, time.Time{}, err
		}
		vms = append(vms, vm)
	}
	for _, vm := range vms {
		select {
		case <-vm.ready:
		case <-vm.done:
			return nil, time.Time{}, vm.result()
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		}
	}
	start := time.Now().Add(o.Lead)
	for _, vm := range vms {
		if err := vm.announce(start); err != nil {
			return nil, start, err
		}
	}
	guests := make([]CovertGuest, len(vms))
	var errs []error
	for i, vm := range vms {
		vm.wait()
		guests[i] = vm.guest
		errs = append(errs, vm.result())
	}
	return guests, start, errors.Join(errs...)
}

// gpuBusy is the fraction of [from, to) the GPU executed submissions.
func gpuBusy(usage []aggregator.Usage, from, to time.Duration) float64 {
	var busy time.Duration
	for _, u := range usage {
		busy += max(0, min(u.End, to)-max(u.Start, from))
	}
	return float64(busy) / float64(to-from)
}

// slotOverrun measures, for strict's frames of equal slots (two VMs of
// weight 1: slot boundaries at multiples of slot on the dispatcher's
// clock), how far the named VM's submissions released in [from, to) ran
// past the end of the slot they started in.
func slotOverrun(usage []aggregator.Usage, name string, slot, from, to time.Duration) Overrun {
	var o Overrun
	for _, u := range usage {
		if u.Name != name || u.Start < from || u.Start >= to {
			continue
		}
		end := u.Start - u.Start%slot + slot
		if over := u.End - end; over > 0 {
			o.Count++
			o.TotalMs += float64(over) / 1e6
			o.MaxMs = max(o.MaxMs, float64(over)/1e6)
		}
	}
	return o
}

// decodeRun decodes the receiver's samples against the message and fills
// the run's error counts, capacity, statistics and periods. The statistic
// of a bit period is the mean latency of the probes submitted in its
// decision window, not the median: while the sender is busy the latencies
// are bimodal — a probe that meets a sender kernel waits for it, one that
// falls in the sender's gap between kernels does not, and those are many —
// and the mean (the window's blocked time over its probes) sees both.
func decodeRun(run *CovertRun, msg string, preamble int, bit time.Duration, rx CovertGuest) error {
	if len(rx.ProbeAtNs) != len(rx.ProbeLatencyNs) {
		return fmt.Errorf("receiver reported %d probe times and %d latencies", len(rx.ProbeAtNs), len(rx.ProbeLatencyNs))
	}
	windows := periodSamples(rx.ProbeAtNs, rx.ProbeLatencyNs, len(msg), bit, covertSkip(bit))
	means := make([]float64, len(windows))
	for i, w := range windows {
		means[i] = mean(w)
	}
	thr, inverted, err := calibrate(means[:preamble], msg[:preamble])
	if err != nil {
		return err
	}
	decoded := decode(means, thr, inverted)
	run.ThresholdUs, run.Inverted = thr/1e3, inverted
	var lat [2][]float64
	for i := range msg {
		if len(windows[i]) == 0 {
			run.EmptyPeriods++
		}
		per := CovertPeriod{Sent: int(msg[i] - '0'), Decoded: int(decoded[i] - '0'), Probes: len(windows[i])}
		if len(windows[i]) > 0 {
			per.MeanUs, per.MedianUs = means[i]/1e3, quantile(windows[i], 0.5)/1e3
		}
		run.Periods = append(run.Periods, per)
		if i >= preamble {
			lat[msg[i]-'0'] = append(lat[msg[i]-'0'], windows[i]...)
		}
	}
	run.Bits = len(msg) - preamble
	run.Errors = bitErrors(msg[preamble:], decoded[preamble:])
	run.BER = float64(run.Errors) / float64(run.Bits)
	run.CapacityBps = BSCCapacity(run.BitsPerSec, run.BER)
	run.Latency0, run.Latency1 = latencyStats(lat[0]), latencyStats(lat[1])
	return nil
}

// periodSamples groups probe latencies (ns) by the bit period their probe
// was submitted in, keeping those submitted at least skip into the period.
func periodSamples(at, lat []int64, periods int, bit, skip time.Duration) [][]float64 {
	out := make([][]float64, periods)
	for i, a := range at {
		if a < 0 {
			continue
		}
		k := int(a / int64(bit))
		if k >= periods || time.Duration(a)-time.Duration(k)*bit < skip {
			continue
		}
		out[k] = append(out[k], float64(lat[i]))
	}
	return out
}

// calibrate sets the decision threshold from the preamble: the midpoint,
// on a log scale, of the mean statistic of its 1-bit periods and of its
// 0-bit periods (the geometric mean of their geometric means). Latencies
// are multiplicative — a busy period's mean is 10–50× an idle one's, and
// its spread as wide — so the arithmetic midpoint would sit deep in the
// busy class and read its quieter periods as 0s. inverted says 1-bits
// showed the lower statistic (the decoder then reads a statistic below the
// threshold as 1). Periods without a sample (NaN) or with a non-positive
// statistic are left out.
func calibrate(stats []float64, preamble string) (threshold float64, inverted bool, err error) {
	var sum [2]float64
	var n [2]int
	for i, s := range stats {
		if math.IsNaN(s) || s <= 0 {
			continue
		}
		b := preamble[i] - '0'
		sum[b] += math.Log(s)
		n[b]++
	}
	for b := range n {
		if n[b] == 0 {
			return 0, false, fmt.Errorf("preamble: no probe in any of its %d-bit periods", b)
		}
	}
	m0, m1 := sum[0]/float64(n[0]), sum[1]/float64(n[1])
	return math.Exp((m0 + m1) / 2), m1 < m0, nil
}

// decode reads each period's statistic against the threshold: above it is
// a 1 (below it, if inverted); a period without a sample (NaN) is a 0.
func decode(stats []float64, threshold float64, inverted bool) []byte {
	out := make([]byte, len(stats))
	for i, s := range stats {
		out[i] = '0'
		if !math.IsNaN(s) && (s > threshold) != inverted {
			out[i] = '1'
		}
	}
	return out
}

// bitErrors counts the positions where sent and got differ.
func bitErrors(sent string, got []byte) int {
	n := 0
	for i := range got {
		if sent[i] != got[i] {
			n++
		}
	}
	return n
}

// H2 is the binary entropy function, in bits.
func H2(p float64) float64 {
	if p <= 0 || p >= 1 {
		return 0
	}
	return -p*math.Log2(p) - (1-p)*math.Log2(1-p)
}

// BSCCapacity is the capacity, in bits per second, of a binary symmetric
// channel that carries rate bits per second with bit error rate p:
// rate × (1 − H2(p)).
func BSCCapacity(rate, p float64) float64 { return rate * (1 - H2(p)) }

// mean returns the mean of xs, NaN for no samples.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// quantile returns the q-quantile of xs (nearest rank on a sorted copy),
// NaN for no samples.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// latencyStats summarises latencies given in ns.
func latencyStats(ns []float64) LatencyStats {
	st := LatencyStats{Count: len(ns)}
	if len(ns) == 0 {
		return st
	}
	st.MeanUs = mean(ns) / 1e3
	st.MedianUs = quantile(ns, 0.5) / 1e3
	st.P95Us = quantile(ns, 0.95) / 1e3
	return st
}

// CovertReadyLine is what a covert-channel VM started without a start time
// writes on its standard error once it is set up; it then reads the start
// time (RFC 3339) as one line on its standard input.
const CovertReadyLine = "gpuvm covert: ready"

// covertVM is one running VM process of the covert-channel harness.
type covertVM struct {
	role  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   bytes.Buffer
	ready chan struct{} // closed when the VM wrote CovertReadyLine
	done  chan struct{} // closed when the process ended and its summary was decoded
	err   error         // the process's exit
	guest CovertGuest
}

// startCovertVM starts cmd, passing its standard error through except the
// ready line, which it turns into vm.ready.
func startCovertVM(cmd *exec.Cmd, role string) (*covertVM, error) {
	vm := &covertVM{role: role, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%s VM: %w", role, err)
	}
	vm.stdin = stdin
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = &vm.out, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s VM: %w", role, err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		readied := false
		for sc.Scan() {
			if line := sc.Text(); line == CovertReadyLine && !readied {
				readied = true
				close(vm.ready)
			} else {
				fmt.Fprintln(os.Stderr, line)
			}
		}
		_, _ = io.Copy(io.Discard, pr) // a line too long for the scanner: let the VM finish
	}()
	go func() {
		defer close(vm.done)
		vm.err = cmd.Wait()
		pw.Close()
		<-scanned
		if vm.out.Len() > 0 {
			if err := json.Unmarshal(vm.out.Bytes(), &vm.guest); err != nil {
				vm.err = errors.Join(vm.err, fmt.Errorf("its output: %w", err))
			}
		}
	}()
	return vm, nil
}

// announce tells the VM the start time.
func (vm *covertVM) announce(start time.Time) error {
	_, err := io.WriteString(vm.stdin, start.Format(time.RFC3339Nano)+"\n")
	if cerr := vm.stdin.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s VM: announce the start: %w", vm.role, err)
	}
	return nil
}

// wait waits for the process to end and its summary to be decoded.
func (vm *covertVM) wait() { <-vm.done }

// result is the VM's outcome: nil if it ran and its kernels verified.
func (vm *covertVM) result() error {
	vm.wait()
	switch {
	case vm.guest.Error != "":
		return fmt.Errorf("%s VM: %s", vm.role, vm.guest.Error)
	case vm.err != nil:
		return fmt.Errorf("%s VM: %w", vm.role, vm.err)
	case !vm.guest.Verified:
		return fmt.Errorf("%s VM: its kernels' results did not verify", vm.role)
	}
	return nil
}
