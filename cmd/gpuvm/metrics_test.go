package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrapeUnix fetches /metrics over a Unix socket and returns the value of
// the first sample whose line starts with prefix (-1: none).
func scrapeUnix(t *testing.T, sock, prefix string) float64 {
	t.Helper()
	// One connection a scrape, closed after it: the endpoint holds at most
	// 16, and a client per call would leave each idle until it times out.
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	resp, err := cl.Get("http://gpuvm/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return v
		}
	}
	return -1
}

// TestServeMetrics: `gpuvm serve` with metrics.listen on a Unix socket
// exports a computing VM's GPU time, growing while it computes, and drops
// its series once it leaves.
func TestServeMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and a VM process")
	}
	dir := t.TempDir()
	sock, ctl, msock := dir+"/agg.sock", dir+"/ctl.sock", dir+"/metrics.sock"
	d := startDaemon(t, daemonConfig(t, dir, sock, ctl, "[metrics]\nlisten = \""+msock+"\"\n"), ctl)
	defer d.stop(t)
	vm := startComputingVM(t, sock, ctl, "busy", 5)
	const gpuTime = `gpuvm_vgpu_gpu_seconds_total{domain="busy",vgpu="0"}`
	first := scrapeUnix(t, msock, gpuTime)
	if first <= 0 {
		t.Fatalf("no GPU time exported for the computing VM: %v", first)
	}
	deadline := time.Now().Add(time.Minute)
	for second := first; second <= first; second = scrapeUnix(t, msock, gpuTime) {
		if time.Now().After(deadline) {
			t.Fatalf("GPU time did not grow while the VM computed: %v → %v", first, second)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cpu := scrapeUnix(t, msock, "process_cpu_seconds_total"); cpu <= 0 {
		t.Errorf("the daemon's CPU time: %v", cpu)
	}
	// The VM goes (its device model killed, as when its domain dies).
	vm.Process.Kill()
	for i := 0; scrapeUnix(t, msock, gpuTime) >= 0; i++ {
		if i > 3000 {
			t.Fatal("the departed VM's series is still exported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if used := scrapeUnix(t, msock, `gpuvm_slots{state="used"}`); used != 0 {
		t.Errorf("used slots %v after the VM left", used)
	}
}
