package aggregator

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/gpuvm/gpuvm/config"
	"github.com/gpuvm/gpuvm/gpu/nvc0"
	"github.com/gpuvm/gpuvm/ipc"
)

// DomainSettings are what a toolstack asks for one domain's vGPU before
// its device model connects (gpuvm xl create reads them from the domain's
// xl config). For that domain they take precedence over the daemon's own
// configuration ([[vm]]); zero fields leave it to the configuration.
//
// Profile names one of the daemon's vGPU profiles (Options.Profiles): it
// supplies VRAM, channels, aperture slices and weight where the settings
// leave them at zero. It is resolved when the settings are registered, so
// a toolstack naming a profile the daemon does not have is told at once.
type DomainSettings struct {
	Mode     string `json:"mode,omitempty"`
	Profile  string `json:"profile,omitempty"`
	VRAM     uint64 `json:"vram,omitempty"`
	Channels int    `json:"channels,omitempty"`
	BAR1     uint64 `json:"bar1,omitempty"`
	BAR3     uint64 `json:"bar3,omitempty"`
	Weight   int    `json:"weight,omitempty"`
}

// maxDomainSettings bounds the settings registered and not yet used: one
// per domain being created, a few per slot.
func (a *Aggregator) maxDomainSettings() int { return 4 * len(a.layout.Slots) }

// validate checks s as the configuration's [[vm]] checks its fields.
func (s DomainSettings) validate() error {
	switch {
	case s.Mode != "" && !IsServedMode(s.Mode):
		return fmt.Errorf("mode %q is not served (have %v)", s.Mode, Modes())
	case s.Channels < 0 || s.Channels > 4096:
		return fmt.Errorf("channels %d: want 0..4096", s.Channels)
	case s.Weight < 0 || s.Weight > config.MaxWeight:
		return fmt.Errorf("weight %d: want 0..%d", s.Weight, config.MaxWeight)
	case s.VRAM > uint64(config.MaxVRAM):
		return fmt.Errorf("vram %d: more than any board has", s.VRAM)
	case s.VRAM%uint64(config.MiB) != 0:
		return fmt.Errorf("vram %d: not a multiple of 1MiB", s.VRAM)
	case s.BAR1 > nvc0.BARSize(nvc0.BAR1) || s.BAR1%nvc0.PageSize != 0:
		return fmt.Errorf("bar1 %d: want a multiple of %d up to %d", s.BAR1, nvc0.PageSize, nvc0.BARSize(nvc0.BAR1))
	case s.BAR3 > nvc0.BARSize(nvc0.BAR3) || s.BAR3%nvc0.PageSize != 0:
		return fmt.Errorf("bar3 %d: want a multiple of %d up to %d", s.BAR3, nvc0.PageSize, nvc0.BARSize(nvc0.BAR3))
	case s.Profile != "" && !config.ValidProfileName(s.Profile):
		return fmt.Errorf("profile %q: not a profile name", s.Profile)
	}
	return nil
}

// withProfile fills s's zero fields from the profile it names.
func (a *Aggregator) withProfile(s DomainSettings) (DomainSettings, error) {
	if s.Profile == "" {
		return s, nil
	}
	p, ok := a.profile(s.Profile)
	if !ok {
		var names []string
		for _, p := range a.opts.Profiles {
			names = append(names, p.Name)
		}
		return s, fmt.Errorf("no vGPU profile %q (have %s; gpuvm vgpu types lists them)", s.Profile, strings.Join(names, ", "))
	}
	s.VRAM = cmp.Or(s.VRAM, p.VRAM)
	s.Channels = cmp.Or(s.Channels, p.Channels)
	s.BAR1 = cmp.Or(s.BAR1, p.BAR1)
	s.BAR3 = cmp.Or(s.BAR3, p.BAR3)
	s.Weight = cmp.Or(s.Weight, p.Weight)
	return s, nil
}

func (a *Aggregator) profile(name string) (Profile, bool) {
	for _, p := range a.opts.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// SetDomainSettings registers settings for domain domid's next vGPU; they
// are forgotten when that vGPU detaches (or by ForgetDomain).
func (a *Aggregator) SetDomainSettings(domid uint32, s DomainSettings) error {
	s, err := a.ResolveDomainSettings(domid, s)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.domains[domid]; !ok && len(a.domains) >= a.maxDomainSettings() {
		return fmt.Errorf("domain %d: settings for %d domains are waiting already", domid, len(a.domains))
	}
	a.domains[domid] = s
	return nil
}

// ResolveDomainSettings checks settings for domain domid as
// SetDomainSettings does and returns them with their profile's sizes filled
// in, without registering them.
func (a *Aggregator) ResolveDomainSettings(domid uint32, s DomainSettings) (DomainSettings, error) {
	if domid < ipc.MinDomID || domid > ipc.MaxDomID {
		return s, fmt.Errorf("domain id %d not in %d..%d", domid, ipc.MinDomID, ipc.MaxDomID)
	}
	if err := s.validate(); err != nil {
		return s, fmt.Errorf("domain %d: %w", domid, err)
	}
	s, err := a.withProfile(s)
	if err == nil {
		err = s.validate() // what the profile filled in, too
	}
	if err != nil {
		return s, fmt.Errorf("domain %d: %w", domid, err)
	}
	return s, nil
}

// DomainSettingsWaiting returns the settings registered for domains whose
// vGPUs have not attached yet.
func (a *Aggregator) DomainSettingsWaiting() map[uint32]DomainSettings {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[uint32]DomainSettings, len(a.domains))
	for d, s := range a.domains {
		out[d] = s
	}
	return out
}

// ForgetDomain drops the settings registered for domid.
func (a *Aggregator) ForgetDomain(domid uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.domains, domid)
}

// domainSettings returns what is registered for g's domain.
func (a *Aggregator) domainSettings(g Guest) DomainSettings {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.domains[g.DomID]
}

// modeFor, weightFor and quotaFor are the registered settings, else the
// daemon's configuration (Options).
func (a *Aggregator) modeFor(g Guest) string {
	if m := a.domainSettings(g).Mode; m != "" {
		return m
	}
	if a.opts.Mode != nil {
		return a.opts.Mode(g)
	}
	return ""
}

func (a *Aggregator) weightFor(g Guest) int {
	if w := a.domainSettings(g).Weight; w > 0 {
		return w
	}
	if a.opts.Weight != nil {
		return max(a.opts.Weight(g), 1)
	}
	return 1
}

func (a *Aggregator) quotaFor(g Guest) Quota {
	var q Quota
	if a.opts.Quota != nil {
		q = a.opts.Quota(g)
	}
	s := a.domainSettings(g)
	return Quota{Channels: cmp.Or(s.Channels, q.Channels), VRAM: cmp.Or(s.VRAM, q.VRAM),
		BAR1: cmp.Or(s.BAR1, q.BAR1), BAR3: cmp.Or(s.BAR3, q.BAR3)}
}

// profileFor names the profile g's vGPU was sized by: its registered
// settings', else, if those set no size of their own, its
// configuration's.
func (a *Aggregator) profileFor(g Guest) string {
	s := a.domainSettings(g)
	if s.Profile != "" {
		return s.Profile
	}
	if s.VRAM != 0 || s.Channels != 0 || s.BAR1 != 0 || s.BAR3 != 0 || a.opts.ProfileOf == nil {
		return ""
	}
	return a.opts.ProfileOf(g)
}

// domainRoutes adds the domain-settings routes to the control API
// (DomainSettingsRoutes) over this aggregator's settings.
func (a *Aggregator) domainRoutes(mux *http.ServeMux) {
	DomainSettingsRoutes(mux, a.DomainSettingsWaiting,
		func(domid uint32, s DomainSettings) (DomainSettings, error) { return s, a.SetDomainSettings(domid, s) },
		a.ForgetDomain)
}

// DomainSettingsRoutes adds the domain-settings routes of a control API to
// mux:
//
//	GET    /v1/domains          settings waiting for their domains (list)
//	PUT    /v1/domains/{domid}  register settings, one JSON DomainSettings of
//	                            at most 4 KiB, unknown fields refused (set)
//	DELETE /v1/domains/{domid}  drop them (forget)
//
// A host of several boards serves the same routes over its own store.
func DomainSettingsRoutes(mux *http.ServeMux, list func() map[uint32]DomainSettings,
	set func(uint32, DomainSettings) (DomainSettings, error), forget func(uint32)) {
	mux.HandleFunc("GET /v1/domains", func(w http.ResponseWriter, r *http.Request) {
		out := map[string]DomainSettings{}
		for d, s := range list() {
			out[strconv.FormatUint(uint64(d), 10)] = s
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("PUT /v1/domains/{domid}", func(w http.ResponseWriter, r *http.Request) {
		domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domain id: " + err.Error()})
			return
		}
		var s DomainSettings
		dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "settings: " + err.Error()})
			return
		}
		if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "settings: one JSON object only"})
			return
		}
		if s, err = set(uint32(domid), s); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s)
	})
	mux.HandleFunc("DELETE /v1/domains/{domid}", func(w http.ResponseWriter, r *http.Request) {
		domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domain id: " + err.Error()})
			return
		}
		forget(uint32(domid))
		writeJSON(w, http.StatusOK, map[string]string{"forgotten": strconv.FormatUint(domid, 10)})
	})
}
