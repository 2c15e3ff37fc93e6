package aggregator

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/gpu/hostmem"
)

// TestDomainSettings: settings a toolstack registers through the control
// API narrow the next vGPU of that domain (channels, VRAM), set its
// weight, override the daemon's configuration, and are forgotten when the
// vGPU goes; bad settings and floods are refused.
func TestDomainSettings(t *testing.T) {
	agg, _ := newTestAggregatorWith(t, Options{MaxVMs: 2, Weight: func(Guest) int { return 3 }})
	srv := httptest.NewServer(agg.ControlHandler())
	defer srv.Close()
	put := func(domid, body string) int {
		t.Helper()
		r, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/domains/"+domid, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const dom = 42
	domid := strconv.Itoa(dom)
	for body, want := range map[string]int{
		`{"mode":"fv-naive","channels":2,"vram":67108864,"weight":5}`: http.StatusOK,
		`{"mode":"nonsense"}`:  http.StatusBadRequest,
		`{"weight":-1}`:        http.StatusBadRequest,
		`{"colour":"blue"}`:    http.StatusBadRequest,
		`{"weight":1}{"x":1}`:  http.StatusBadRequest,
		`{"channels":1000000}`: http.StatusBadRequest,
	} {
		if got := put("7", body); got != want {
			t.Errorf("PUT %s: status %d, want %d", body, got, want)
		}
	}
	if got := put("0", `{}`); got != http.StatusBadRequest {
		t.Errorf("domain 0 accepted: %d", got)
	}
	if got := put(domid, `{"mode":"fv-naive","channels":2,"vram":67108864,"weight":5}`); got != http.StatusOK {
		t.Fatalf("PUT: %d", got)
	}
	// A flood of registrations is bounded.
	var last int
	for i := 100; i < 100+agg.maxDomainSettings(); i++ {
		last = put(strconv.Itoa(i), `{"weight":2}`)
	}
	if last != http.StatusBadRequest {
		t.Errorf("registration %d accepted", agg.maxDomainSettings()+2)
	}
	for i := 100; i < 100+agg.maxDomainSettings(); i++ {
		agg.ForgetDomain(uint32(i))
	}
	agg.ForgetDomain(7)
	ram, err := hostmem.New("vm1", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	f, err := ram.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := agg.Attach(Guest{DomID: dom, Name: "vm1", Mode: "fv-naive"}, f, ram.Size())
	if err != nil {
		t.Fatal(err)
	}
	g := &guestVM{v: v}
	if g.v.Slot.Chans != 2 || g.v.Slot.VRAM.Size != 64<<20 {
		t.Errorf("the registered quota did not narrow the slot: %d channels, %d MiB", g.v.Slot.Chans, g.v.Slot.VRAM.Size>>20)
	}
	if w := agg.weightFor(g.v.Guest); w != 5 {
		t.Errorf("weight %d, want the registered 5 over the configuration's 3", w)
	}
	if err := agg.Detach(g.v); err != nil {
		t.Fatal(err)
	}
	if w := agg.weightFor(g.v.Guest); w != 3 {
		t.Errorf("after detach the weight is %d: the settings outlived their vGPU", w)
	}
	// A mode other than the registered one is refused for that domain.
	if err := agg.SetDomainSettings(dom, DomainSettings{Mode: "pv-multicall"}); err != nil {
		t.Fatal(err)
	}
	if m := agg.modeFor(g.v.Guest); m != "pv-multicall" {
		t.Errorf("mode %q", m)
	}
}
