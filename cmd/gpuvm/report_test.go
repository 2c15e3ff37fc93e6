package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuvm/gpuvm/bench"
	"github.com/gpuvm/gpuvm/bench/report"
	"github.com/gpuvm/gpuvm/guest-driver/workloads"
)

// TestBenchReportQuick is issue 19's CI command, `gpuvm bench report
// --quick --out DIR`: every experiment runs, every result verifies, every
// figure of §4.3 is drawn, and the page renders in a real browser where
// Chromium is installed.
func TestBenchReportQuick(t *testing.T) {
	if testing.Short() || os.Getenv("GPUVM_LONG") == "" {
		t.Skip("runs the whole evaluation at small sizes (2 minutes alone, more on a loaded machine): a slow suite, run with GPUVM_LONG=1")
	}
	dir := t.TempDir()
	_, stderr, err := runApp(t, "bench", "report", "--quick", "--out", dir)
	if err != nil {
		t.Fatalf("report: %v\nstderr:\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "about") || !strings.Contains(stderr, "left]") {
		t.Errorf("no estimate of the time left in the progress:\n%s", stderr)
	}
	js, err := os.ReadFile(filepath.Join(dir, report.JSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var ev bench.Evaluation
	if err := json.Unmarshal(js, &ev); err != nil {
		t.Fatal(err)
	}
	if len(ev.Commands) == 0 || ev.Commands[0] != "gpuvm bench report --out "+dir+" --quick" {
		t.Errorf("the report's own command is %q", ev.Commands)
	}
	modes := benchModes()
	if want := len(modes) * len(workloads.Names()); len(ev.Modes.Results) != want {
		t.Errorf("%d mode results, want every mode × every workload = %d", len(ev.Modes.Results), want)
	}
	for _, r := range ev.Modes.Results {
		if !r.Verified {
			t.Errorf("%s %s did not verify: %s", r.Mode, r.Workload, r.Error)
		}
	}
	if !ev.Contexts.Verified() || len(ev.Fairness.Runs) == 0 {
		t.Errorf("contexts verified %v, %d fairness runs", ev.Contexts.Verified(), len(ev.Fairness.Runs))
	}
	figs, err := filepath.Glob(filepath.Join(dir, report.FiguresDir, "*.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"fig4.3-", "fig4.4-", "fig4.5-", "fig4.8-", "fig4.9-", "fig4.10-", "fig4.11-", "fig4.12-", "fig4.13-"} {
		n := 0
		for _, f := range figs {
			if strings.HasPrefix(filepath.Base(f), prefix) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("no figure %s*", prefix)
		}
	}
	screenshot(t, filepath.Join(dir, report.IndexFile))
}

// screenshot renders page in headless Chromium, when it is installed, and
// checks that it drew something: a PNG of the page's size that is not one
// colour. Set GPUVM_REPORT_SCREENSHOT to keep the picture.
func screenshot(t *testing.T, page string) {
	t.Helper()
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		t.Log("no Chromium (apt-get install chromium to check that the report renders); skipping the browser check")
		return
	}
	shot := filepath.Join(t.TempDir(), "report.png")
	if keep := os.Getenv("GPUVM_REPORT_SCREENSHOT"); keep != "" {
		shot = keep
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--window-size=1400,2400", "--screenshot="+shot, "file://"+page)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	b, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	bounds := img.Bounds()
	if bounds.Dx() != 1400 || bounds.Dy() != 2400 {
		t.Errorf("screenshot %v, want 1400×2400", bounds)
	}
	colours := map[[3]uint32]bool{}
	for y := bounds.Min.Y; y < bounds.Max.Y && len(colours) < 64; y += 7 {
		for x := bounds.Min.X; x < bounds.Max.X; x += 7 {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	if len(colours) < 16 {
		t.Errorf("the rendered page has %d colours: blank or broken", len(colours))
	}
}
