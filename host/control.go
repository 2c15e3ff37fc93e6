package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/aggregator"
)

// BoardInfo is one board as the control API reports it.
type BoardInfo struct {
	Index        int     `json:"index"`
	Name         string  `json:"name"`
	State        State   `json:"state"`
	Timing       string  `json:"timing,omitempty"`
	Slots        int     `json:"slots"`
	Used         int     `json:"used"`
	OutOfService int     `json:"out_of_service"`
	Free         int     `json:"free"`
	Load         float64 `json:"load"`   // share of GPU time used over the last 2 s
	Queued       int     `json:"queued"` // submissions waiting now
	Weight       int     `json:"weight"` // scheduling weight placed on it
	VRAMPerSlot  uint64  `json:"vram_per_slot"`
	// Lost says why a failed board was found lost.
	Lost string `json:"lost,omitempty"`
}

// BoardInfos describes every board.
func (h *Host) BoardInfos() []BoardInfo {
	states := h.states()
	loads := h.load.sample(h.boards, time.Now())
	var out []BoardInfo
	for i, b := range h.boards {
		c := h.candidate(b, states[i], loads[i])
		l := b.Agg.Layout()
		bi := BoardInfo{Index: b.Index, Name: b.Name, State: states[i], Timing: b.Timing, Slots: len(l.Slots),
			OutOfService: len(b.Agg.OutOfService()), Free: c.Free, Load: c.Load, Queued: c.Queued, Weight: c.Weight}
		bi.Used = bi.Slots - bi.Free - bi.OutOfService
		_, bi.Lost = b.Agg.Lost()
		if len(l.Slots) > 0 {
			bi.VRAMPerSlot = l.Slots[0].VRAM.Size
		}
		out = append(out, bi)
	}
	return out
}

// SetState cordons or uncordons the board called name.
func (h *Host) SetState(name string, s State) error {
	b := h.Board(name)
	if b == nil {
		return fmt.Errorf("no board %q", name)
	}
	if s != StateActive && s != StateCordoned {
		return fmt.Errorf("board state %q cannot be set", s)
	}
	if lost, why := b.Agg.Lost(); lost {
		return fmt.Errorf("board %q failed (%s): its state cannot change", name, why)
	}
	h.mu.Lock()
	old := b.state
	b.state = s
	h.mu.Unlock()
	if old != s {
		h.log.Info("board state", "board", name, "from", old, "to", s)
	}
	return nil
}

// ControlHandler serves the control API over every board:
//
//	GET    /v1/vgpus                    every vGPU with its board and slot
//	GET    /v1/vgpus/{id}[/...]         one vGPU (its board's aggregator answers)
//	DELETE /v1/vgpus/{id}               tear a vGPU down
//	POST   /v1/vgpus/{id}/move?to=BOARD move a running vGPU to a free slot of BOARD
//	GET    /v1/boards                   the boards, their states and loads
//	GET    /v1/boards/{name}/layout     how a board is partitioned
//	POST   /v1/boards/{name}/cordon     take a board out of placement
//	POST   /v1/boards/{name}/uncordon   put it back
//	POST   /v1/boards/{name}/drain      cordon it and move every vGPU that can move to the other boards
//	POST   /v1/boards/{name}/fail       make it fall off the bus (with Options.FaultInjection only)
//	POST   /v1/boards/{name}/repair     put it back on the bus (with Options.FaultInjection only)
//	POST   /v1/boards/{name}/reinit     bring a failed board that answers again back into service
//	GET    /v1/placements               the latest placement decisions and moves, and why
//	GET    /v1/balance                  the load balancer: settings, moves, holds, its latest looks
//	GET    /v1/layout                   the layout, on a host of one board
//	GET    /v1/types                    the profiles and how many more of each fit, all boards
//	GET|PUT|DELETE /v1/domains[/{domid}] settings for domains not connected yet
//	POST   /v1/domains/{domid}/restore  a vGPU state image for the domain's next device model
//	POST   /v1/domains/{domid}/migrate-in  a live migration's stream for the domain (migrate.go)
//	POST   /v1/vgpus/{id}/migrate[-verdict]  a live migration's source side (forwarded to the board)
//	POST|DELETE /v1/domains/{domid}/pvdrm  start or stop a Xen domain's pvdrm back end (gpuvm serve --xen)
func (h *Host) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/vgpus", func(w http.ResponseWriter, r *http.Request) {
		infos := []aggregator.VGPUInfo{}
		for _, b := range h.boards {
			infos = append(infos, b.Agg.Infos()...)
		}
		writeJSON(w, http.StatusOK, infos)
	})
	forward := func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
			return
		}
		b, _ := h.Lookup(id)
		if b == nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
			return
		}
		b.ctl.ServeHTTP(w, r)
	}
	mux.HandleFunc("POST /v1/vgpus/{id}/move", h.serveMove)
	mux.HandleFunc("/v1/vgpus/{id}", forward)
	mux.HandleFunc("/v1/vgpus/{id}/{rest...}", forward)
	mux.HandleFunc("GET /v1/boards", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, h.BoardInfos())
	})
	mux.HandleFunc("GET /v1/boards/{name}/layout", func(w http.ResponseWriter, r *http.Request) {
		if b := h.Board(r.PathValue("name")); b != nil {
			writeJSON(w, http.StatusOK, b.Agg.Layout())
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such board"})
	})
	for verb, s := range map[string]State{"cordon": StateCordoned, "uncordon": StateActive} {
		mux.HandleFunc("POST /v1/boards/{name}/"+verb, func(w http.ResponseWriter, r *http.Request) {
			if err := h.SetState(r.PathValue("name"), s); err != nil {
				writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, map[string]string{"board": r.PathValue("name"), "state": string(s)})
		})
	}
	mux.HandleFunc("POST /v1/boards/{name}/drain", h.serveDrain)
	mux.HandleFunc("POST /v1/boards/{name}/fail", func(w http.ResponseWriter, r *http.Request) {
		b := h.faultTarget(w, r, func(b *Board) bool { return b.FailBus != nil })
		if b == nil {
			return
		}
		h.log.Warn("fault injection: board falls off the bus", "board", b.Name)
		b.FailBus()
		writeJSON(w, http.StatusOK, map[string]string{"board": b.Name, "injected": "fell off the bus"})
	})
	mux.HandleFunc("POST /v1/boards/{name}/repair", h.serveRepair)
	mux.HandleFunc("POST /v1/boards/{name}/reinit", h.serveReinit)
	mux.HandleFunc("GET /v1/placements", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, h.Decisions())
	})
	mux.HandleFunc("GET /v1/balance", h.serveBalance)
	mux.HandleFunc("GET /v1/layout", func(w http.ResponseWriter, r *http.Request) {
		if len(h.boards) != 1 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf(
				"this host has %d boards: ask for one, /v1/boards/{name}/layout (gpuvm board layout NAME)", len(h.boards))})
			return
		}
		writeJSON(w, http.StatusOK, h.boards[0].Agg.Layout())
	})
	mux.HandleFunc("GET /v1/types", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, h.Types())
	})
	h.domainRoutes(mux)
	return mux
}

// Types lists the profiles with how many more vGPUs of each the active
// boards can take.
func (h *Host) Types() []aggregator.TypeInfo {
	states := h.states()
	var out []aggregator.TypeInfo
	for i, b := range h.boards {
		for j, t := range b.Agg.Types() {
			if i == 0 {
				out = append(out, t)
				out[j].Available = 0
			}
			if states[i] == StateActive && j < len(out) {
				out[j].Available += t.Available
			}
		}
	}
	if out == nil {
		out = []aggregator.TypeInfo{}
	}
	return out
}

// domainRoutes serves domain settings: held by the host until the domain's
// device model connects, then given to the board it is placed on.
func (h *Host) domainRoutes(mux *http.ServeMux) {
	aggregator.DomainSettingsRoutes(mux, h.domainsWaiting, h.SetDomainSettings, h.ForgetDomain)
	mux.HandleFunc("POST /v1/domains/{domid}/restore", h.serveRestore)      // restore.go
	mux.HandleFunc("POST /v1/domains/{domid}/migrate-in", h.serveMigrateIn) // migrate.go
	mux.HandleFunc("DELETE /v1/domains/{domid}/migrate-in", func(w http.ResponseWriter, r *http.Request) {
		aggregator.ServeForgetMigration(w, r, func(domid uint32) {
			for _, b := range h.boards {
				b.Agg.ForgetRestore(domid)
			}
		})
	})
	mux.HandleFunc("POST /v1/domains/{domid}/pvdrm", h.serveStartXenPVDRM)
	mux.HandleFunc("DELETE /v1/domains/{domid}/pvdrm", func(w http.ResponseWriter, r *http.Request) {
		domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
		if err != nil || !h.StopXenPVDRM(uint32(domid)) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no pvdrm back end runs for that domain"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "stopping"})
	})
}

// serveStartXenPVDRM starts a Xen domain's pvdrm back end (body: a
// XenPVDRMRequest, at most 4 KiB).
func (h *Host) serveStartXenPVDRM(w http.ResponseWriter, r *http.Request) {
	domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domid: " + err.Error()})
		return
	}
	var req XenPVDRMRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
		return
	}
	if err := h.StartXenPVDRM(uint32(domid), req); err != nil {
		status := http.StatusConflict
		if errors.Is(err, ErrNoXen) {
			status = http.StatusNotImplemented
		}
		writeJSON(w, status, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "waiting for the guest's front end"})
}

// domainsWaiting lists the settings waiting at the host and at the boards.
func (h *Host) domainsWaiting() map[uint32]aggregator.DomainSettings {
	out := map[uint32]aggregator.DomainSettings{}
	for _, b := range h.boards {
		maps.Copy(out, b.Agg.DomainSettingsWaiting())
	}
	h.mu.Lock()
	maps.Copy(out, h.pending)
	h.mu.Unlock()
	return out
}

// SetDomainSettings checks settings for domid's next vGPU (as every board
// would: they share profiles and slot sizes) and holds them until its
// device model connects. At most four per slot of the host wait.
func (h *Host) SetDomainSettings(domid uint32, s aggregator.DomainSettings) (aggregator.DomainSettings, error) {
	s, err := h.boards[0].Agg.ResolveDomainSettings(domid, s)
	if err != nil {
		return s, err
	}
	limit := 0
	for _, b := range h.boards {
		limit += 4 * len(b.Agg.Layout().Slots)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.pending[domid]; !ok && len(h.pending) >= limit {
		return s, fmt.Errorf("domain %d: settings for %d domains are waiting already", domid, len(h.pending))
	}
	h.pending[domid] = s
	return s, nil
}

// ForgetDomain drops the settings held for domid, wherever they wait.
func (h *Host) ForgetDomain(domid uint32) {
	h.mu.Lock()
	delete(h.pending, domid)
	h.mu.Unlock()
	for _, b := range h.boards {
		b.Agg.ForgetDomain(domid)
	}
}

// takePending removes and returns the settings held for domid.
func (h *Host) takePending(domid uint32) (aggregator.DomainSettings, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.pending[domid]
	delete(h.pending, domid)
	return s, ok
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
