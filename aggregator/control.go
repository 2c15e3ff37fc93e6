package aggregator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// VGPUInfo is one vGPU as the control API reports it.
type VGPUInfo struct {
	ID        int            `json:"id"`
	Board     int            `json:"board"`                // the board's index among the daemon's
	BoardName string         `json:"board_name,omitempty"` // its configured name
	Slot      int            `json:"slot"`                 // its slot on that board
	DomID     uint32         `json:"domid"`
	Name      string         `json:"name"`
	Mode      string         `json:"mode"`
	PID       int32          `json:"devmodel_pid,omitempty"` // its device model's process
	Profile   string         `json:"profile,omitempty"`      // the vGPU profile that sized it
	VRAMBase  uint64         `json:"vram_base"`
	VRAMBytes uint64         `json:"vram_bytes"`
	ChanBase  int            `json:"channel_base"`
	Channels  int            `json:"channels"`
	BAR1Bytes uint64         `json:"bar1_bytes"`
	BAR3Bytes uint64         `json:"bar3_bytes"`
	Counters  map[string]any `json:"counters"`
	// Sched is its account with the GPU scheduler.
	Sched SchedStats `json:"sched"`
	// VRAMInUse is how much of its slot's VRAM holds pages it wrote (-1:
	// the host GPU cannot tell).
	VRAMInUse int64 `json:"vram_in_use"`
	// Evicted: the vGPU is parked (evict.go) — it holds no slot (Slot is
	// -1) and VRAMInUse is its image.
	Evicted bool `json:"evicted,omitempty"`
	// Lost says why the vGPU is a lost device (lost.go): its board fell
	// off the bus while it was resident; a reset brings it back.
	Lost string `json:"lost,omitempty"`
}

// Info describes a vGPU.
func (v *VGPU) Info() VGPUInfo {
	return v.info(v.SchedStats())
}

func (v *VGPU) info(s SchedStats) VGPUInfo {
	a, slot := v.where()
	info := VGPUInfo{ID: v.ID, Board: a.opts.Board, BoardName: a.opts.BoardName, Slot: slot.Index, DomID: v.Guest.DomID, Name: v.Guest.Name, Mode: v.Guest.Mode, PID: v.Guest.PID,
		VRAMBase: slot.VRAM.Base, VRAMBytes: slot.VRAM.Size, ChanBase: slot.ChanBase, Channels: slot.Chans,
		BAR1Bytes: slot.BAR1.Size, BAR3Bytes: slot.BAR3.Size, Profile: v.profile,
		Counters: Report(v.Counters().Map()), Sched: s, VRAMInUse: v.VRAMInUse(), Evicted: v.Evicted()}
	_, info.Lost = v.Lost()
	return info
}

// Profile names the vGPU profile that sized v ("": none).
func (v *VGPU) Profile() string { return v.profile }

// VRAMResidenter is implemented by host GPUs that can tell how much of a
// VRAM slice holds pages (the simulated board's sparse memfds).
type VRAMResidenter interface {
	VRAMResident(base, size uint64) (uint64, error)
}

// VRAMInUse is how many bytes of v's whole slot hold pages it wrote since
// the slot was last scrubbed, or -1 if the host GPU cannot tell. A fully
// virtualized guest's allocator is its own business: what it touched is
// what the host can know.
func (v *VGPU) VRAMInUse() int64 {
	a, slot := v.where()
	r, ok := a.gpu.(VRAMResidenter)
	if !ok {
		return -1
	}
	if slot.Index < 0 { // parked: what its image holds (evict.go)
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.image != nil {
			return int64(v.image.bytes)
		}
		return 0
	}
	full := a.layout.Slots[slot.Index].VRAM
	n, err := r.VRAMResident(full.Base, full.Size)
	if err != nil {
		return -1
	}
	return int64(n)
}

// Infos describes every attached vGPU, their scheduler accounts taken at
// one instant.
func (a *Aggregator) Infos() []VGPUInfo {
	stats := a.SchedStats()
	infos := []VGPUInfo{}
	for _, v := range a.VGPUs() {
		infos = append(infos, v.info(stats[v]))
	}
	return infos
}

// ControlHandler serves the control API:
//
//	GET    /v1/vgpus       every attached vGPU with its counters
//	GET    /v1/vgpus/{id}  one vGPU
//	DELETE /v1/vgpus/{id}  tear a vGPU down (its VM loses the GPU)
//	POST   /v1/vgpus/{id}/reset  reset a vGPU in place (its guest re-initialises)
//	POST   /v1/vgpus/{id}/evict  park a vGPU (evict.go): its slot is freed, its
//	                             guest's next access brings it back
//	POST   /v1/vgpus/{id}/save   park a vGPU and stream its state image (save.go);
//	                             it is held parked for the commit (?keep=1: stays parked)
//	POST   /v1/vgpus/{id}/save/commit?token=T  the image is safe: destroy the vGPU
//	POST   /v1/vgpus/{id}/save/abort?token=T   it is not: the vGPU resumes here
//	POST   /v1/domains/{domid}/restore  an image for the domain's next device model (restore.go)
//	POST   /v1/vgpus/{id}/migrate, /migrate-verdict, /v1/domains/{domid}/migrate-in
//	                             a live migration's two sides (migrate_serve.go)
//	GET    /v1/layout      how the board is partitioned
//	GET    /v1/types       the vGPU profiles and how many more of each fit
//
// and the domain settings of domains.go (/v1/domains).
func (a *Aggregator) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	a.domainRoutes(mux)
	a.typeRoutes(mux)
	mux.HandleFunc("GET /v1/vgpus", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Infos())
	})
	mux.HandleFunc("GET /v1/vgpus/{id}", func(w http.ResponseWriter, r *http.Request) {
		if v := a.lookup(r.PathValue("id")); v != nil {
			writeJSON(w, http.StatusOK, v.Info())
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
	})
	mux.HandleFunc("DELETE /v1/vgpus/{id}", func(w http.ResponseWriter, r *http.Request) {
		v := a.lookup(r.PathValue("id"))
		if v == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
			return
		}
		if err := a.Destroy(v, fmt.Sprintf("vGPU %d destroyed through the control API", v.ID)); err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"destroyed": strconv.Itoa(v.ID)})
	})
	mux.HandleFunc("POST /v1/vgpus/{id}/reset", func(w http.ResponseWriter, r *http.Request) {
		a.serveReset(w, r.PathValue("id"))
	})
	mux.HandleFunc("POST /v1/vgpus/{id}/save", a.serveSave)
	mux.HandleFunc("POST /v1/vgpus/{id}/save/commit", a.serveSaveEnd(true))
	mux.HandleFunc("POST /v1/vgpus/{id}/save/abort", a.serveSaveEnd(false))
	mux.HandleFunc("POST /v1/domains/{domid}/restore", a.serveRestore)
	a.migrateRoutes(mux) // migrate_serve.go
	mux.HandleFunc("POST /v1/vgpus/{id}/evict", func(w http.ResponseWriter, r *http.Request) {
		a.serveEvict(w, r)
	})
	mux.HandleFunc("GET /v1/layout", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.layout)
	})
	return mux
}

func (a *Aggregator) lookup(id string) *VGPU {
	n, err := strconv.Atoi(id)
	if err != nil {
		return nil
	}
	for _, v := range a.VGPUs() {
		if v.ID == n {
			return v
		}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
