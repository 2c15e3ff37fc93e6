package devmodel_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/devmodel"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/gdev"
	"github.com/gpuvm/gpuvm/guest-driver/nouveau"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
	"github.com/gpuvm/gpuvm/ipc"
)

// servedAggregator is an aggregator on a simulated board serving device
// models on a socket of dir, until the test ends.
func servedAggregator(t *testing.T, dir, name string) (*aggregator.Aggregator, string) {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 1<<30, 4
	part := config.PartitionConfig{VRAMPerVM: 256 << 20, ChannelsPerVM: 8, BAR1PerVM: 16 << 20, BAR3PerVM: 4 << 20, Reserved: 128 << 20}
	layout, err := aggregator.NewLayout(part, 2, cfg.VRAMSize, cfg.Channels)
	if err != nil {
		t.Fatal(err)
	}
	cfg.VRAMSegments = layout.Segments(cfg.VRAMSize) // remap hands out a slice
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	agg, err := aggregator.New(board, aggregator.Options{MaxVMs: 2, Channels: cfg.Channels, Partition: part})
	if err != nil {
		board.Close()
		t.Fatal(err)
	}
	sock := filepath.Join(dir, name+".sock")
	ln, err := ipc.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agg.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served; ln.Close(); agg.Close(); board.Close() })
	return agg, sock
}

// resumeScene is two aggregators, a and b, and a device model for
// domain 9 on a that resumes on b after a save.
func resumeScene(t *testing.T, name string, posted bool) (a, b *aggregator.Aggregator, dev *devmodel.Device) {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpuvm-resume-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a, sockA := servedAggregator(t, dir, "a")
	b, sockB := servedAggregator(t, dir, "b")
	dev, err = devmodel.Connect(context.Background(), devmodel.Config{Socket: sockA, DomID: 9, Name: name, Mode: "fv-optimized", RAMSize: 64 << 20,
		ResumeTimeout: time.Minute, ResumeSockets: []string{sockB}, PostedWrites: posted})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return a, b, dev
}

// TestResumeOnAnotherAggregator: a guest loops verified madd and cpy
// through a device model on aggregator a; its vGPU is saved on a and
// restored on b; the device model, told b's socket, resumes there and the
// loop goes on verifying, never seeing an error. Its remap slice is the
// new slot's. With posted writes too: those a did not run when it parked
// the vGPU are repeated on b (ipc.Client.UnrunPosted).
func TestResumeOnAnotherAggregator(t *testing.T) {
	for _, posted := range []bool{false, true} {
		t.Run(map[bool]string{false: "completed writes", true: "posted writes"}[posted], func(t *testing.T) {
			testResumeOnAnotherAggregator(t, posted)
		})
	}
}

func testResumeOnAnotherAggregator(t *testing.T, posted bool) {
	a, b, dev := resumeScene(t, "saved", posted)
	ctx := context.Background()
	if dev.Welcome().Params[ipc.ParamRemap] != "1" {
		t.Fatal("no remap on the first connection")
	}
	bar1, bar3 := dev.BARSizes()
	drv, err := nouveau.Open(dev, dev.RAM(), nouveau.Options{BAR1Size: bar1, BAR3Size: bar3, PV: bench.DriverPVMode("fv-optimized")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.Close() })

	var mu sync.Mutex
	runs, onB := 0, 0
	var failed []string
	stop := make(chan struct{})
	done := make(chan struct{})
	resumed := func() bool { return dev.Resumes() > 0 }
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := []string{"madd", "cpy"}[i%2]
			w, err := workloads.New(name, workloads.Params{MatrixDim: 16, CopyBytes: 64 << 10})
			if err != nil {
				panic(err)
			}
			res := bench.RunWorkloadWith(ctx, "fv-optimized", gdev.Nouveau(drv), w, 1, nil, nil, bench.RunOptions{NoWarmup: true})
			mu.Lock()
			runs++
			if resumed() {
				onB++
			}
			if !res.Verified {
				failed = append(failed, name+": "+res.Error)
			}
			mu.Unlock()
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute) // a hang guard only
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				<-done
				t.Fatalf("timed out waiting for %s (failed runs %q)", what, failed)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("a run on a", func() bool { mu.Lock(); defer mu.Unlock(); return runs >= 2 })

	vs := a.VGPUs()
	if len(vs) != 1 {
		t.Fatalf("%d vGPUs on a", len(vs))
	}
	var img bytes.Buffer
	start := time.Now()
	if _, err := a.Save(ctx, vs[0], &img, false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RegisterRestore(9, &img); err != nil {
		t.Fatal(err)
	}
	waitFor("the device model to resume on b", resumed)
	t.Logf("save → restore → resume: %v", time.Since(start))
	waitFor("two runs on b", func() bool { mu.Lock(); defer mu.Unlock(); return onB >= 3 })
	close(stop)
	<-done
	if len(failed) > 0 {
		t.Fatalf("runs failed: %q", failed)
	}
	if n := len(a.VGPUs()); n != 0 {
		t.Errorf("%d vGPUs left on a", n)
	}
	bv := b.VGPUs()
	if len(bv) != 1 || uint32(bv[0].ID) != dev.Welcome().VGPU {
		t.Fatalf("b's vGPUs %v, the device model's %d", bv, dev.Welcome().VGPU)
	}
	if dev.Err() != nil || dev.Welcome().Params[ipc.ParamRemap] != "1" {
		t.Errorf("after the resume: err %v, remap %q", dev.Err(), dev.Welcome().Params[ipc.ParamRemap])
	}
}

// TestResumeTimesOut: a saved vGPU that no daemon restores fails the
// device model once its bound passes, with an error that says so and
// what the daemon answered; its accesses then read as a dead device's.
func TestResumeTimesOut(t *testing.T) {
	dir, err := os.MkdirTemp("", "gpuvm-resume-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a, sock := servedAggregator(t, dir, "a")
	dev, err := devmodel.Connect(context.Background(), devmodel.Config{Socket: sock, DomID: 4, Name: "lonely", Mode: "fv-optimized", RAMSize: 16 << 20,
		ResumeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	var img bytes.Buffer
	if _, err := a.Save(context.Background(), a.VGPUs()[0], &img, false); err != nil {
		t.Fatal(err)
	}
	if v := dev.Read32(nvc0.BAR0, 0); v != 0xFFFFFFFF {
		t.Errorf("read after a failed resume: %#x", v)
	}
	err = dev.Err()
	if err == nil || !strings.Contains(err.Error(), "no daemon restored it for domain 4 within 300ms") || !strings.Contains(err.Error(), ipc.RejectNoImage) {
		t.Fatalf("Err() = %v", err)
	}
	if n := len(a.VGPUs()); n != 0 {
		t.Errorf("a resuming Hello without an image got a vGPU: %d attached", n)
	}
}

// TestResumeRepeatsUnrunPostedWrites: a guest floods posted writes through
// the PRAMIN window — each word of 1 MiB of its VRAM gets its own index —
// while its vGPU is saved on a and restored on b. Every write reaches the
// vGPU exactly where it was meant: those a had not run when it parked
// the vGPU are repeated on b (docs/protocol.md §6.9), so after the resume
// every word reads back its index. Without the repeat the words queued
// behind the park would read 0.
func TestResumeRepeatsUnrunPostedWrites(t *testing.T) {
	a, b, dev := resumeScene(t, "posted", true)
	ctx := context.Background()
	const window = 16 << 20 // guest VRAM address of the window
	dev.Write32(nvc0.BAR0, nvc0.RegPRAMINWindow, nvc0.PRAMINWindowEncode(window))
	const words = nvc0.PRAMINSize / 4
	var written atomic.Int64
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		for i := range uint32(words) {
			dev.Write32(nvc0.BAR0, nvc0.PRAMINBase+4*uint64(i), i+1)
			written.Add(1)
		}
	}()
	for written.Load() < words/8 {
		time.Sleep(100 * time.Microsecond)
	}
	vs := a.VGPUs()
	if len(vs) != 1 {
		t.Fatalf("%d vGPUs on a", len(vs))
	}
	var img bytes.Buffer
	if _, err := a.Save(ctx, vs[0], &img, false); err != nil {
		t.Fatal(err)
	}
	atSave := written.Load()
	if _, err := b.RegisterRestore(9, &img); err != nil {
		t.Fatal(err)
	}
	<-flood
	if atSave >= words {
		t.Fatalf("the flood (%d writes) ended before the save: nothing was left to repeat", words)
	}
	if dev.Resumes() != 1 || dev.Err() != nil {
		t.Fatalf("resumes %d, err %v", dev.Resumes(), dev.Err())
	}
	bad := 0
	for i := range uint32(words) {
		if got := dev.Read32(nvc0.BAR0, nvc0.PRAMINBase+4*uint64(i)); got != i+1 {
			if bad++; bad <= 5 {
				t.Errorf("word %d reads %#x, want %#x", i, got, i+1)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d words lost across the save (%d written when it began)", bad, words, atSave)
	}
}
