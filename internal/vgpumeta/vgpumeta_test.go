package vgpumeta

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpuvm/gpuvm/config"
)

// domain wraps metadata in a domain XML document as libvirt returns it.
func domain(metadata string) []byte {
	return []byte(`<domain type='test' id='2'>
  <name>vm1</name>
  <uuid>6695eb01-f6a4-8304-79aa-97f2502e193f</uuid>
  <metadata>
    <other:thing xmlns:other="http://example.org/other/1" mode="x"/>` + metadata + `
  </metadata>
  <memory unit='KiB'>65536</memory>
  <os><type arch='x86_64'>hvm</type></os>
</domain>`)
}

const ns = `xmlns:gpuvm="` + Namespace + `"`

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, metadata string
		want           VGPU
	}{
		{"defaults", `<gpuvm:vgpu ` + ns + `/>`, VGPU{Mode: config.ModeFVOptimized}},
		{"profile", `<gpuvm:vgpu ` + ns + ` mode="pv-multicall" profile="vgpu-128m"/>`,
			VGPU{Mode: config.ModePVMulticall, Profile: "vgpu-128m"}},
		{"explicit", `<gpuvm:vgpu ` + ns + ` mode="fv-lazy" vram="128MiB" channels="8" weight="3" bar1="16MiB" bar3="4MiB"/>`,
			VGPU{Mode: config.ModeFVLazy, VRAM: 128 * config.MiB, Channels: 8, Weight: 3, BAR1: 16 * config.MiB, BAR3: 4 * config.MiB}},
		{"default namespace, white space inside", `<vgpu xmlns="` + Namespace + `" mode="pvdrm">
		  <!-- a comment -->
		</vgpu>`, VGPU{Mode: config.ModePVDRM}},
	} {
		v, ok, err := Parse(domain(tc.metadata))
		if err != nil || !ok {
			t.Errorf("%s: ok %v, err %v", tc.name, ok, err)
			continue
		}
		if v != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, v, tc.want)
		}
	}
}

func TestParseNone(t *testing.T) {
	for _, doc := range []string{
		string(domain("")),
		`<domain type='test'><name>x</name></domain>`,
		// gpuvm's element outside <metadata> is not metadata.
		`<domain><devices><gpuvm:vgpu ` + ns + ` mode="nonsense"/></devices></domain>`,
	} {
		if v, ok, err := Parse([]byte(doc)); ok || err != nil {
			t.Errorf("%s: %+v, %v, %v; want no vGPU, no error", doc, v, ok, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		metadata, want string
	}{
		{`<gpuvm:vgpu ` + ns + ` colour="red"/>`, `unknown attribute "colour" (have bar1, bar3, channels, mode, profile, vram, weight)`},
		{`<gpuvm:vgpu ` + ns + ` mode="native"/>`, `attribute mode: "native": want one of fv-naive`},
		{`<gpuvm:vgpu ` + ns + ` profile="Big GPU"/>`, `attribute profile: "Big GPU": not a profile name`},
		{`<gpuvm:vgpu ` + ns + ` vram="lots"/>`, `attribute vram: invalid size "lots"`},
		{`<gpuvm:vgpu ` + ns + ` vram="0"/>`, `attribute vram: "0": want more than 0`},
		{`<gpuvm:vgpu ` + ns + ` vram="1000KiB"/>`, `attribute vram: "1000KiB": want a multiple of 1MiB`},
		{`<gpuvm:vgpu ` + ns + ` bar1="6KiB"/>`, `attribute bar1: "6KiB": want a multiple of 4KiB`},
		{`<gpuvm:vgpu ` + ns + ` channels="0"/>`, `attribute channels: "0": want a whole number 1..4096`},
		{`<gpuvm:vgpu ` + ns + ` weight="1e3"/>`, `attribute weight: "1e3": want a whole number 1..10000`},
		{`<gpuvm:vgpu ` + ns + ` gpuvm:mode="fv-lazy"/>`, `unknown attribute "` + Namespace + `:mode"`},
		{`<gpuvm:vgpu ` + ns + `/><gpuvm:vgpu ` + ns + `/>`, `more than one <vgpu> element`},
		{`<gpuvm:gpu ` + ns + `/>`, `unknown element <gpu> in namespace`},
		{`<gpuvm:vgpu ` + ns + `><mode>fv-lazy</mode></gpuvm:vgpu>`, `has no child elements (found <mode>)`},
		{`<gpuvm:vgpu ` + ns + `>fv-lazy</gpuvm:vgpu>`, `has no text content (found "fv-lazy")`},
	} {
		_, ok, err := Parse(domain(tc.metadata))
		if err == nil || !ok || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ok %v, err %v; want an error containing %q", tc.metadata, ok, err, tc.want)
		}
	}
}

func TestParseUntrusted(t *testing.T) {
	big := domain(`<gpuvm:vgpu ` + ns + `/>` + strings.Repeat(" ", MaxDocument))
	if _, _, err := Parse(big); err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Errorf("oversized document: %v", err)
	}
	for _, doc := range []string{
		`<domain><metadata><gpuvm:vgpu ` + ns + `/>`, // truncated
		`<domain><metadata></domain>`,                // mismatched
		`not xml at all <`,
		strings.Repeat("<a>", 20000), // deep, and unterminated
	} {
		if _, _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("%.40s...: no error", doc)
		}
	}
}

// TestParseErrorsBounded: an error quotes at most a little of what is
// wrong, however large (a wrong domain is logged at every sync).
func TestParseErrorsBounded(t *testing.T) {
	big := strings.Repeat("x", MaxDocument/2)
	zeros := strings.Repeat("0", MaxDocument/2)
	for i, doc := range []string{
		string(domain(`<gpuvm:vgpu ` + ns + ` mode="` + big + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` profile="` + big + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` vram="` + big + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` vram="1` + big + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` vram="` + zeros + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` bar1="1` + zeros + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` channels="` + big + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` weight="` + zeros + `"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` ` + big + `="1"/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + ` xmlns:o="` + big + `" o:mode="1"/>`)),
		string(domain(`<gpuvm:` + big + ` ` + ns + `/>`)),
		string(domain(`<gpuvm:vgpu ` + ns + `><` + big + `/></gpuvm:vgpu>`)),
		string(domain(`<gpuvm:vgpu ` + ns + `>` + big + `</gpuvm:vgpu>`)),
		`<domain><metadata><` + big + `></domain>`,
		`<domain><metadata><` + strings.Repeat("é", MaxDocument/4) + `></domain>`,
	} {
		_, _, err := Parse([]byte(doc))
		if err == nil {
			t.Errorf("case %d: no error", i)
			continue
		}
		if len(err.Error()) > 512 || !utf8.ValidString(err.Error()) {
			t.Errorf("case %d: an error of %d bytes: %.600s", i, len(err.Error()), err)
		}
	}
}

// FuzzParse: no input makes Parse panic, and what it accepts is valid.
func FuzzParse(f *testing.F) {
	f.Add(domain(`<gpuvm:vgpu ` + ns + ` mode="pv-multicall" profile="vgpu-128m" vram="64MiB"/>`))
	f.Add(domain(`<gpuvm:vgpu ` + ns + ` colour="red"/>`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		v, ok, err := Parse(doc)
		if err == nil && ok && (!v.Mode.Valid() || v.VRAM%config.MiB != 0 || v.Channels < 0 || v.Channels > 4096) {
			t.Errorf("accepted %+v", v)
		}
	})
}
