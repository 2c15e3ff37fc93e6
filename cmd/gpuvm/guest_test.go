package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/guest-driver/xenguest"
)

// runGuestApp runs gpuvm guest ARGS and returns what it wrote.
func runGuestApp(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, &errOut
	err = app.RunContext(context.Background(), append([]string{"gpuvm", "guest"}, args...))
	return out.String(), errOut.String(), err
}

// Bad flags are usage errors (exit 2, one line), found before any device
// is opened.
func TestGuestUsageErrors(t *testing.T) {
	dma := "--dma=0x1000000:16MiB"
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "--dma BASE:SIZE is required"},
		{[]string{"--dma", "0x1000000"}, "want BASE:SIZE"},
		{[]string{"--dma", "zz:16MiB"}, `base "zz" is not a number`},
		{[]string{"--dma", "0x1000800:16MiB"}, "multiples of 4 KiB"},
		{[]string{"--dma", "0x1000000:0"}, "zero size"},
		{[]string{"--dma", "0x1000000:16XB"}, "unknown unit"},
		{[]string{"--dma", "0xfffffffffffff000:16MiB"}, "overflows"},
		{[]string{dma, "--mode", "pvdrm"}, "the pvdrm modes give the guest no GPU registers"},
		{[]string{dma, "--mode", "warp"}, `--mode "warp": want one of fv-naive`},
		{[]string{dma, "--bars", "0x1000,0x2000"}, "want BAR0ADDR,BAR1ADDR,BAR3ADDR[,IOPORT]"},
		{[]string{dma, "--bars", "0xf0000000,0xe0000000,0xe8000800"}, "BAR3 address 0xe8000800 is not page aligned"},
		{[]string{dma, "--bars", "0xf0000000,0xf1000000,0xe8000000"}, "BAR0 and BAR1 overlap"},
		{[]string{dma, "--bars", "0xf0000000,0xe0000000,0xe8000000,0xfff0"}, "must fit below 0x10000"},
		{[]string{dma, "--bars", "0xf0000000,0xe0000000,0xe8000000", "--mode", "pv-multicall"}, "add its I/O port"},
		{[]string{"--dma=0xe0000000:16MiB", "--bars", "0xf0000000,0xe0000000,0xe8000000"}, "overlaps BAR1"},
		{[]string{dma, "--bars", "0xf0000000,0xe0000000,0xe8000000", "--pci", "00:05.0"}, "--bars and --pci: give one"},
		{[]string{dma, "--pci", "5.0"}, "want domain:bus:device.function"},
		{[]string{dma, "--bar1-size", "200MiB"}, "up to the BAR's 128MiB"},
		{[]string{dma, "--bar3-size", "1000"}, "multiple of 4KiB"},
		{[]string{dma, "--runs", "0"}, "want at least 1"},
		{[]string{dma, "--workloads", "frob"}, "frob"},
		{[]string{dma, "--matrix-dim", "5000"}, "out of range"},
		{[]string{dma, "--round-trips", "-1"}, "want 0 or more"},
		{[]string{dma, "now"}, `unexpected argument "now"`},
	} {
		stdout, stderr, err := runGuestApp(t, tt.args...)
		if code := exitCode(context.Background(), err); code != exitUsage {
			t.Errorf("%v: exit %d (%v), want %d", tt.args, code, err, exitUsage)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tt.want) || strings.Contains(msg, "\n") {
			t.Errorf("%v: error %q, want one line containing %q", tt.args, msg, tt.want)
		}
		if stdout != "" || strings.Contains(stderr, "guest:") {
			t.Errorf("%v: output before the usage error:\n%s%s", tt.args, stdout, stderr)
		}
	}
}

func TestGuestHelp(t *testing.T) {
	stdout, _, err := runGuestApp(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"USAGE:", "memmap=SIZE$BASE", "--dma", "--bars", "PVH", "bar1_per_vm", "pvdrm", "round trip"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("help lacks %q:\n%s", want, stdout)
		}
	}
}

// The whole path on stand-in files: the vGPU is found in a fake sysfs,
// its BARs mapped from the resource files, the DMA range from a fake
// /dev/mem after the resource-map check. Files are no GPU: the driver
// reads PMC_BOOT_0 (written into resource0 here) and then a memory
// partition count of 0, and gives up; the command says so, exits 1 and
// still reports the accesses it made.
func TestGuestOnFiles(t *testing.T) {
	dir := t.TempDir()
	sysfs := filepath.Join(dir, "devices")
	fn := filepath.Join(sysfs, "0000:00:05.0")
	if err := os.MkdirAll(fn, 0o755); err != nil {
		t.Fatal(err)
	}
	resource := "0x00000000f0000000 0x00000000f1ffffff 0x0000000000040200\n" +
		"0x00000000e0000000 0x00000000e7ffffff 0x000000000014220c\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x00000000e8000000 0x00000000ebffffff 0x000000000014220c\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x000000000000c000 0x000000000000c07f 0x0000000000040101\n"
	files := map[string]string{"vendor": "0x10de\n", "device": "0x06d8\n", "resource": resource}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(fn, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, bar := range []int{0, 1, 3} {
		truncated(t, filepath.Join(fn, fmt.Sprintf("resource%d", bar)), int64(nvc0.BARSize(bar)))
	}
	f, err := os.OpenFile(filepath.Join(fn, "resource0"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var w [4]byte
	binary.LittleEndian.PutUint32(w[:], nvc0.Boot0Value)
	if _, err := f.WriteAt(w[:], nvc0.RegBoot0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	mem := truncated(t, filepath.Join(dir, "mem"), 64<<20)
	iomem := filepath.Join(dir, "iomem")
	if err := os.WriteFile(iomem, []byte("00000000-00ffffff : System RAM\n01000000-02ffffff : Reserved\n03000000-03ffffff : System RAM\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--sysfs", sysfs, "--dev-mem", mem, "--iomem", iomem, "--round-trips", "10"}

	stdout, stderr, err := runGuestApp(t, append(base, "--dma", "0x1000000:32MiB")...)
	if code := exitCode(context.Background(), err); code != exitFailure {
		t.Fatalf("exit %d (%v), want %d\n%s%s", code, err, exitFailure, stdout, stderr)
	}
	if !strings.Contains(err.Error(), "guest driver: open: memory partition count 0 out of range") {
		t.Errorf("error %v", err)
	}
	// PMC_BOOT_0 and the partition count: two reads through resource0.
	if !strings.Contains(stderr, "guest: 2 BAR accesses") || !strings.Contains(stderr, "BAR0 2/0") || !strings.Contains(stderr, "mean ") {
		t.Errorf("trap summary:\n%s", stderr)
	}

	// A DMA range the guest kernel uses: refused, naming the parameter.
	_, _, err = runGuestApp(t, append(base, "--dma", "0x3000000:16MiB")...)
	if err == nil || !strings.Contains(err.Error(), "memmap=16M$0x3000000") || exitCode(context.Background(), err) != exitFailure {
		t.Errorf("System RAM as DMA: %v", err)
	}
	// The explicit SBDF of a function that is not there.
	_, _, err = runGuestApp(t, append(base, "--dma", "0x1000000:32MiB", "--pci", "0000:00:06.0")...)
	if err == nil || !strings.Contains(err.Error(), "0000:00:06.0") {
		t.Errorf("missing --pci function: %v", err)
	}
	// PVH: the BARs at given addresses of /dev/mem.
	big := truncated(t, filepath.Join(dir, "bigmem"), 0x30000000)
	stdout, stderr, err = runGuestApp(t, "--dev-mem", big, "--iomem", iomem, "--round-trips", "0",
		"--bars", "0x8000000,0x10000000,0x20000000", "--dma", "0x1000000:32MiB")
	if code := exitCode(context.Background(), err); code != exitFailure || !strings.Contains(err.Error(), "is not a Fermi") {
		t.Errorf("--bars on zeroed memory: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}
}

func truncated(t *testing.T, path string, size int64) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

// countingPort is the simulated board's port with the counts
// xenguest.BARs keeps: the stand-in for the vGPU's BARs when the command's
// run is tested without Xen.
type countingPort struct {
	p *sim.Port
	s xenguest.Stats
}

func (c *countingPort) Read32(bar int, off uint64) uint32 {
	t := time.Now()
	v := c.p.Read32(bar, off)
	c.s.ReadNs[bar] += uint64(time.Since(t))
	c.s.Reads[bar]++
	return v
}

func (c *countingPort) Write32(bar int, off uint64, v uint32) {
	t := time.Now()
	c.p.Write32(bar, off, v)
	c.s.WriteNs[bar] += uint64(time.Since(t))
	c.s.Writes[bar]++
}

// Fill32 stores word by word, counted as xenguest.BARs counts a fill.
func (c *countingPort) Fill32(bar int, off uint64, v uint32, n int) {
	t := time.Now()
	for i := range uint64(n) {
		c.p.Write32(bar, off+4*i, v)
	}
	c.s.FillNs[bar] += uint64(time.Since(t))
	c.s.Fills[bar]++
	c.s.FillWords[bar] += uint64(n)
}

func (c *countingPort) Stats() xenguest.Stats { return c.s }
func (c *countingPort) Err() error            { return nil }

// The command's run after the devices are open, on the simulated board:
// the workloads verify, the table and the trap summary are printed, and
// the JSON results carry the guest's own access counts.
func TestGuestRunOnBoard(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.VRAMSize, cfg.MemPartitions = 256<<20, 1
	board, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer board.Close()
	ram, err := hostmem.New("guest-test", 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	base, err := board.RegisterSystemMemory(ram.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ram.SetBusBase(base)
	port := &countingPort{p: board.NewPort()}

	run := func(args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		cmd := guestCommand()
		cmd.Action = func(c *cli.Context) error {
			f, err := parseGuestFlags(c)
			if err != nil {
				return err
			}
			return guestRun(c, f, port, ram, slog.New(slog.DiscardHandler))
		}
		app := &cli.App{Name: "gpuvm", Commands: []*cli.Command{cmd}, Writer: &out, ErrWriter: &errOut}
		err := app.RunContext(context.Background(), append([]string{"gpuvm", "guest", "--dma", "0x1000000:16MiB", "--matrix-dim", "16", "--runs", "2", "--round-trips", "50"}, args...))
		return out.String(), errOut.String(), err
	}
	stdout, stderr, err := run("--workloads", "madd,nop")
	if err != nil {
		t.Fatalf("%v\n%s%s", err, stdout, stderr)
	}
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"board: virtual GPU (in a Xen guest, fv-optimized), 256 MiB VRAM", "fv-optimized  madd      verified", "fv-optimized  nop       verified"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	for _, want := range []string{"guest: fv-optimized madd: ", " BAR accesses per run, mean ", "guest: fv-optimized nop: ", "PMC_BOOT_0 read round trip", "(mean of 50)", "mean ", "words stored by fills", " fills (one REP STOSL each"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if want := fmt.Sprintf("guest: %d BAR accesses", port.s.Accesses()); !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q (every access made during the run):\n%s", want, stderr)
	}

	stdout, stderr, err = run("--workloads", "mmul", "--json")
	if err != nil {
		t.Fatalf("%v\n%s%s", err, stdout, stderr)
	}
	var results []struct {
		Workload string
		Verified bool
		Counters map[string]uint64
	}
	if err := json.Unmarshal([]byte(stdout), &results); err != nil {
		t.Fatalf("JSON: %v\n%s", err, stdout)
	}
	if len(results) != 1 || !results[0].Verified || results[0].Counters["guest_bar0_writes"] == 0 ||
		results[0].Counters["guest_access_mean_ns"] == 0 || results[0].Counters["guest_access_ns"] == 0 ||
		results[0].Counters["guest_bar3_fills"] == 0 || results[0].Counters["guest_fill_words"] == 0 {
		t.Errorf("JSON results %+v", results)
	}
}
