package aggregator

import (
	"net/http"
)

// Profile is a named vGPU size (config.ProfileConfig, resolved against the
// partition) as the aggregator serves it.
type Profile struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	VRAM        uint64 `json:"vram"`
	Channels    int    `json:"channels"`
	BAR1        uint64 `json:"bar1"`
	BAR3        uint64 `json:"bar3"`
	Weight      int    `json:"weight"`
}

// Quota narrows a guest's slot: fewer channels, less VRAM, smaller
// aperture slices (the guest is told the smaller sizes and reaches nothing
// beyond). Zero fields, or values beyond the slot, leave it whole.
type Quota struct {
	Channels   int
	VRAM       uint64
	BAR1, BAR3 uint64
}

// narrow returns slot narrowed by q.
func (q Quota) narrow(slot Slot, largePage, page uint64) Slot {
	if q.Channels > 0 && q.Channels < slot.Chans {
		slot.Chans = q.Channels
	}
	if q.VRAM > 0 && q.VRAM < slot.VRAM.Size {
		slot.VRAM.Size = q.VRAM &^ (largePage - 1)
	}
	if q.BAR1 > 0 && q.BAR1 < slot.BAR1.Size {
		slot.BAR1.Size = q.BAR1 &^ (page - 1)
	}
	if q.BAR3 > 0 && q.BAR3 < slot.BAR3.Size {
		slot.BAR3.Size = q.BAR3 &^ (page - 1)
	}
	return slot
}

// fits reports whether p fits slot.
func (p Profile) fits(slot Slot) bool {
	return p.VRAM <= slot.VRAM.Size && p.Channels <= slot.Chans && p.BAR1 <= slot.BAR1.Size && p.BAR3 <= slot.BAR3.Size
}

// TypeInfo is a vGPU profile with how many more vGPUs of it can be
// attached now: the free slots (not in use, not out of service) it fits.
type TypeInfo struct {
	Profile
	Available int `json:"available"`
}

// Types lists the profiles with their availability.
func (a *Aggregator) Types() []TypeInfo {
	a.mu.Lock()
	var free []Slot
	for i, v := range a.vgpus {
		if v == nil && a.slotFree(i) {
			free = append(free, a.layout.Slots[i])
		}
	}
	a.mu.Unlock()
	out := []TypeInfo{}
	for _, p := range a.opts.Profiles {
		t := TypeInfo{Profile: p}
		for _, s := range free {
			if p.fits(s) {
				t.Available++
			}
		}
		out = append(out, t)
	}
	return out
}

// typeRoutes adds GET /v1/types (Types) to the control API.
func (a *Aggregator) typeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/types", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Types())
	})
}
