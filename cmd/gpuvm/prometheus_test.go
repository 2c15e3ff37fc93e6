package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// promQuery runs an instant query against a Prometheus server and returns
// the value of its first sample (-1: no sample).
func promQuery(t *testing.T, server, query string) float64 {
	t.Helper()
	resp, err := http.Get(server + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return -1 // not up yet
	}
	defer resp.Body.Close()
	var r struct {
		Status string
		Data   struct {
			Result []struct {
				Value [2]any
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" || len(r.Data.Result) == 0 {
		return -1
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("query %q: value %q", query, s)
	}
	return v
}

// TestRealPrometheusScrapes: a real Prometheus server (Debian's
// prometheus package) scrapes `gpuvm serve`'s endpoint and sees a VM's GPU
// time grow. It runs where the prometheus binary is installed
// (apt-get install prometheus); CI does not install it.
func TestRealPrometheusScrapes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon, a VM and Prometheus")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus binary (apt-get install prometheus to run this test)")
	}
	dir := t.TempDir()
	sock, ctl := dir+"/agg.sock", dir+"/ctl.sock"
	mport, pport := freePort(t), freePort(t)
	d := startDaemon(t, daemonConfig(t, dir, sock, ctl, fmt.Sprintf("[metrics]\nlisten = \"127.0.0.1:%d\"\n", mport)), ctl)
	defer d.stop(t)
	conf := fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpuvm\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n", mport)
	if err := os.WriteFile(dir+"/prometheus.yml", []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	var plog bytes.Buffer
	p := exec.Command(prom, "--config.file="+dir+"/prometheus.yml", "--storage.tsdb.path="+dir+"/tsdb",
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", pport))
	p.Stdout, p.Stderr = &plog, &plog
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { p.Process.Kill(); p.Wait() }()
	startComputingVM(t, sock, ctl, "busy", 5)
	server := fmt.Sprintf("http://127.0.0.1:%d", pport)
	deadline := time.Now().Add(60 * time.Second)
	var first float64
	for first <= 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus never saw the VM's GPU time\n%s", plog.String())
		}
		time.Sleep(500 * time.Millisecond)
		first = promQuery(t, server, `gpuvm_vgpu_gpu_seconds_total{job="gpuvm",domain="busy"}`)
	}
	for second := first; second <= first; second = promQuery(t, server, `gpuvm_vgpu_gpu_seconds_total{job="gpuvm",domain="busy"}`) {
		if time.Now().After(deadline) {
			t.Fatalf("the VM's GPU time did not grow in Prometheus (%v)\n%s", first, plog.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if up := promQuery(t, server, `up{job="gpuvm"}`); up != 1 {
		t.Errorf("up = %v", up)
	}
	if cpu := promQuery(t, server, `process_cpu_seconds_total{job="gpuvm"}`); cpu <= 0 {
		t.Errorf("the daemon's CPU time in Prometheus: %v", cpu)
	}
}
