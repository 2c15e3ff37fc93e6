// Package vgpumeta reads the vGPU a libvirt domain asks for from its
// domain XML: one element of gpuvm's own XML namespace in the domain's
// <metadata>, e.g.
//
//	<metadata>
//	  <gpuvm:vgpu xmlns:gpuvm="https://github.com/gpuvm/gpuvm/xmlns/vgpu/1"
//	              mode="fv-optimized" profile="vgpu-256m"/>
//	</metadata>
//
// The domain XML is the operator's, but it reaches gpuvm through libvirtd,
// so it is read as untrusted input: bounded in size, every attribute
// checked, anything unknown refused with its name. docs/libvirt.md
// documents the element.
package vgpumeta

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpuvm/gpuvm/config"
)

// Namespace is the XML namespace of gpuvm's metadata element. Its last
// path element is the version of the element's format.
const Namespace = "https://github.com/gpuvm/gpuvm/xmlns/vgpu/1"

// Element is the local name of gpuvm's metadata element.
const Element = "vgpu"

// MaxDocument bounds the domain XML read, in bytes. libvirt's own domain
// XML stays far below it (libvirtd bounds an RPC string at 4 MiB).
const MaxDocument = 1 << 20

// VGPU is the vGPU a domain's metadata asks for. Zero sizes, channels and
// weight leave them to the profile (if one is named) and then to the
// daemon's configuration, as aggregator.DomainSettings does.
type VGPU struct {
	Mode     config.Mode // default fv-optimized
	Profile  string      // a vGPU profile of the daemon's ("": none)
	VRAM     config.Size // a multiple of 1 MiB
	Channels int         // 1..4096
	Weight   int         // 1..10000
	BAR1     config.Size // a multiple of 4 KiB
	BAR3     config.Size // a multiple of 4 KiB
}

// attributes is the table of the element's attributes.
func attributes() map[string]func(v *VGPU, val string) error {
	return map[string]func(*VGPU, string) error{
		"mode": func(v *VGPU, val string) error {
			m := config.Mode(val)
			if !m.Valid() {
				return fmt.Errorf("%q: want one of %s", truncate(val, maxQuoted), strings.Join(config.ModeNames(), ", "))
			}
			v.Mode = m
			return nil
		},
		"profile": func(v *VGPU, val string) error {
			if !config.ValidProfileName(val) {
				return fmt.Errorf("%q: not a profile name (gpuvm vgpu types lists them)", truncate(val, maxQuoted))
			}
			v.Profile = val
			return nil
		},
		"vram":     func(v *VGPU, val string) (err error) { v.VRAM, err = size(val, config.MiB, "1MiB"); return err },
		"bar1":     func(v *VGPU, val string) (err error) { v.BAR1, err = size(val, 4*config.KiB, "4KiB"); return err },
		"bar3":     func(v *VGPU, val string) (err error) { v.BAR3, err = size(val, 4*config.KiB, "4KiB"); return err },
		"channels": func(v *VGPU, val string) (err error) { v.Channels, err = count(val, 4096); return err },
		"weight":   func(v *VGPU, val string) (err error) { v.Weight, err = count(val, 10000); return err },
	}
}

// size parses a size attribute: more than 0, a multiple of unit.
func size(val string, unit config.Size, unitName string) (config.Size, error) {
	if len(val) > maxQuoted {
		// config.ParseSize's errors quote it, and what it parsed.
		return 0, fmt.Errorf("invalid size %q: too long", truncate(val, maxQuoted))
	}
	s, err := config.ParseSize(val)
	switch {
	case err != nil:
		return 0, err
	case s == 0:
		return 0, fmt.Errorf("%q: want more than 0 (leave the attribute out for the profile's or the slot's)", val)
	case s%unit != 0:
		return 0, fmt.Errorf("%q: want a multiple of %s", val, unitName)
	}
	return s, nil
}

// count parses a whole-number attribute, 1..hi.
func count(val string, hi int) (int, error) {
	n, err := strconv.Atoi(val)
	if err != nil || n < 1 || n > hi {
		return 0, fmt.Errorf("%q: want a whole number 1..%d", truncate(val, maxQuoted), hi)
	}
	return n, nil
}

// Attributes lists the attributes the element may have, sorted.
func Attributes() []string { return slices.Sorted(maps.Keys(attributes())) }

// Parse returns the vGPU domainXML's metadata asks for, and whether it
// asks for one (a domain without gpuvm's element gets no vGPU, and that
// is no error). Every problem with the element, or a document too large
// or not well-formed, is an error saying what is wrong.
func Parse(domainXML []byte) (VGPU, bool, error) {
	if len(domainXML) > MaxDocument {
		return VGPU{}, false, fmt.Errorf("domain XML of %d bytes: more than the %d gpuvm reads", len(domainXML), MaxDocument)
	}
	d := xml.NewDecoder(bytes.NewReader(domainXML))
	var (
		path  []string // local names of the open elements
		found *xml.StartElement
	)
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return VGPU{}, false, fmt.Errorf("domain XML: %w", boundedError{err})
		}
		switch t := tok.(type) {
		case xml.StartElement:
			inMetadata := len(path) == 2 && path[0] == "domain" && path[1] == "metadata"
			if inMetadata && t.Name.Space == Namespace {
				if t.Name.Local != Element {
					return VGPU{}, true, fmt.Errorf("gpuvm metadata: unknown element <%s> in namespace %s (want <%s>)", truncate(t.Name.Local, maxQuoted), Namespace, Element)
				}
				if found != nil {
					return VGPU{}, true, fmt.Errorf("gpuvm metadata: more than one <%s> element: one vGPU per domain", Element)
				}
				el := t.Copy()
				found = &el
				if err := onlyEmpty(d); err != nil {
					return VGPU{}, true, err
				}
				continue // onlyEmpty consumed the end element
			}
			path = append(path, t.Name.Local)
		case xml.EndElement:
			path = path[:len(path)-1]
		}
	}
	if found == nil {
		return VGPU{}, false, nil
	}
	v, err := fromAttrs(found.Attr)
	return v, true, err
}

// onlyEmpty reads the rest of gpuvm's element: it has no content but
// white space (and comments).
func onlyEmpty(d *xml.Decoder) error {
	for {
		tok, err := d.Token()
		if err != nil {
			return fmt.Errorf("domain XML: %w", boundedError{err})
		}
		switch t := tok.(type) {
		case xml.EndElement:
			return nil
		case xml.StartElement:
			return fmt.Errorf("gpuvm metadata: <%s> has no child elements (found <%s>); settings are attributes", Element, truncate(t.Name.Local, maxQuoted))
		case xml.CharData:
			if len(bytes.TrimSpace(t)) > 0 {
				return fmt.Errorf("gpuvm metadata: <%s> has no text content (found %q); settings are attributes", Element, truncate(strings.TrimSpace(string(t)), maxQuoted))
			}
		}
	}
}

// fromAttrs reads the element's attributes.
func fromAttrs(attrs []xml.Attr) (VGPU, error) {
	v := VGPU{Mode: config.ModeFVOptimized}
	table := attributes()
	seen := map[string]bool{}
	for _, a := range attrs {
		if a.Name.Space == "xmlns" || a.Name.Space == "" && a.Name.Local == "xmlns" {
			continue // namespace declarations
		}
		name := a.Name.Local
		if a.Name.Space != "" {
			name = a.Name.Space + ":" + name
		}
		set, ok := table[name]
		if !ok {
			return v, fmt.Errorf("gpuvm metadata: unknown attribute %q (have %s)", truncate(name, maxQuoted), strings.Join(Attributes(), ", "))
		}
		if seen[name] {
			return v, fmt.Errorf("gpuvm metadata: attribute %q given twice", name)
		}
		seen[name] = true
		if err := set(&v, strings.TrimSpace(a.Value)); err != nil {
			return v, fmt.Errorf("gpuvm metadata: attribute %s: %w", name, err)
		}
	}
	return v, nil
}

// maxQuoted bounds, in bytes, what an error message quotes of the domain
// XML (a value, a name): a domain whose metadata is wrong is logged at
// every sync, and a megabyte attribute must not make megabyte log lines.
const maxQuoted = 64

// maxDecoderError bounds the message of an error of the XML decoder, which
// quotes element names.
const maxDecoderError = 256

// truncate shortens s to n bytes (a whole UTF-8 sequence less, rather than
// half of one) for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// boundedError is an error whose message is truncated.
type boundedError struct{ err error }

func (e boundedError) Error() string { return truncate(e.err.Error(), maxDecoderError) }
func (e boundedError) Unwrap() error { return e.err }
