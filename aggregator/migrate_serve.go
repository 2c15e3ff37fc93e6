package aggregator

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/vgpuimage"
)

// The control API of a live migration: the source streams
// (POST /v1/vgpus/{id}/migrate) and waits, holding the vGPU parked, for
// the verdict of whoever carried the stream to the destination
// (POST /v1/vgpus/{id}/migrate-verdict); the destination reads a stream
// for a domain (POST /v1/domains/{domid}/migrate-in). gpuvm vgpu migrate
// joins them, directly or through a command such as ssh, as xl migrate
// does.

// MigrationTokenHeader carries a migration's token in the answer that
// streams it; its verdict must name it.
const MigrationTokenHeader = "Gpuvm-Migration-Token"

// MigrateVerdictWait bounds how long a parked vGPU waits, once its stream
// ended, for the verdict; without one it stays here.
const MigrateVerdictWait = 2 * time.Minute

// MigrateInTimeout bounds how long a destination reads one stream.
const MigrateInTimeout = 30 * time.Minute

// MigrateVerdict is the body of POST /v1/vgpus/{id}/migrate-verdict.
type MigrateVerdict struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// MigrateInResult is the answer of POST /v1/domains/{domid}/migrate-in.
type MigrateInResult struct {
	Restore RestoreInfo `json:"restore"`
	Bytes   uint64      `json:"stream_bytes"`
	Records int         `json:"records"`
}

func (a *Aggregator) migrateRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/vgpus/{id}/migrate", a.serveMigrate)
	mux.HandleFunc("POST /v1/vgpus/{id}/migrate-verdict", a.serveMigrateVerdict)
	mux.HandleFunc("POST /v1/domains/{domid}/migrate-in", a.serveMigrateIn)
	mux.HandleFunc("DELETE /v1/domains/{domid}/migrate-in", func(w http.ResponseWriter, r *http.Request) {
		ServeForgetMigration(w, r, a.ForgetRestore)
	})
}

// ServeForgetMigration answers DELETE /v1/domains/{domid}/migrate-in: the
// image a migration left waiting for the domain is dropped, because the
// source did not let the vGPU go (its relay says so); a device model that
// resumes later must not find that stale state. 200, or 400 for a bad id.
func ServeForgetMigration(w http.ResponseWriter, r *http.Request, forget func(domid uint32)) {
	domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domain id: " + err.Error()})
		return
	}
	forget(uint32(domid))
	writeJSON(w, http.StatusOK, map[string]uint64{"forgotten": domid})
}

// serveMigrate answers POST /v1/vgpus/{id}/migrate[?rounds=N&target=BYTES]:
// 200 and the stream as the body, with the migration's token in
// MigrationTokenHeader; 404 for no such vGPU, 501 for one that cannot be
// migrated, 409 when a migration of it is under way. An error once the
// stream began aborts the answer (the reader finds the stream cut short);
// the vGPU stays here.
func (a *Aggregator) serveMigrate(w http.ResponseWriter, r *http.Request) {
	v := a.lookup(r.PathValue("id"))
	if v == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such vGPU"})
		return
	}
	if err := pvdrmLeaves(v); err != nil {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": err.Error()})
		return
	}
	var opts MigrateOptions
	opts.MaxRounds, _ = strconv.Atoi(r.URL.Query().Get("rounds"))
	opts.TargetBytes, _ = strconv.ParseUint(r.URL.Query().Get("target"), 10, 64)
	m := newMigration(v)
	m.token = rand.Text()
	m.verdict, m.done = make(chan error, 1), make(chan migrateResult, 1)
	if !v.migration.CompareAndSwap(nil, m) {
		writeJSON(w, http.StatusConflict, map[string]string{"error": ErrMigrating.Error()})
		return
	}
	defer v.migration.CompareAndSwap(m, nil)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(MigrationTokenHeader, m.token)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(MigrateTimeout))
	m.stopping = func() {
		// From the park on the guest waits: the rest of the stream must
		// go within the verdict's bound, else the vGPU stays here.
		_ = rc.SetWriteDeadline(time.Now().Add(MigrateVerdictWait))
	}
	commit := func(ctx context.Context) error {
		if err := rc.Flush(); err != nil {
			return err
		}
		t := time.NewTimer(MigrateVerdictWait)
		defer t.Stop()
		select {
		case err := <-m.verdict:
			return err
		case <-t.C:
			return fmt.Errorf("no verdict within %v", MigrateVerdictWait)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), MigrateTimeout)
	defer cancel()
	cur, _ := v.where()
	st, err := cur.migrate(ctx, m, w, opts, commit)
	m.done <- migrateResult{st: st, err: err}
	if err != nil {
		a.log.Warn("migration failed: the vGPU stays here", "vgpu", v.ID, "err", err)
	}
}

// serveMigrateVerdict answers POST /v1/vgpus/{id}/migrate-verdict?token=T
// with a MigrateVerdict body: the destination's answer, which the source
// waits for before it destroys the vGPU. 200 with the MigrateStats once
// the migration completed; 409 with the reason when it did not (the vGPU
// stays here); 404 when no migration of the vGPU has that token.
func (a *Aggregator) serveMigrateVerdict(w http.ResponseWriter, r *http.Request) {
	v := a.lookup(r.PathValue("id"))
	var m *migration
	if v != nil {
		m = v.migration.Load()
	}
	if m == nil || m.verdict == nil || subtle.ConstantTimeCompare([]byte(m.token), []byte(r.URL.Query().Get("token"))) != 1 {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such migration"})
		return
	}
	var vd MigrateVerdict
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&vd); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "verdict: " + err.Error()})
		return
	}
	var verdict error
	if !vd.OK {
		verdict = fmt.Errorf("the destination refused it: %s", vd.Error)
	}
	select {
	case m.verdict <- verdict:
	default:
		writeJSON(w, http.StatusConflict, map[string]string{"error": "the verdict was given already"})
		return
	}
	select {
	case res := <-m.done:
		if res.err != nil {
			writeJSON(w, http.StatusConflict, map[string]string{"error": res.err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, res.st)
	case <-r.Context().Done():
	}
}

// serveMigrateIn answers POST /v1/domains/{domid}/migrate-in: the body is
// a migration stream (§14), read within MigrateInTimeout; 200 with a
// MigrateInResult once its image waits for the domain, 400 with the
// reason when it is refused (nothing registered).
func (a *Aggregator) serveMigrateIn(w http.ResponseWriter, r *http.Request) {
	domid, err := strconv.ParseUint(r.PathValue("domid"), 10, 32)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "domain id: " + err.Error()})
		return
	}
	// An incoming stream holds up to a slot's VRAM: it is one of the
	// daemon's image transfers, as a restore is.
	done, ok := a.reg.TryImageTransfer()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": ErrTransfersBusy.Error()})
		return
	}
	defer done()
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(MigrateInTimeout))
	img, info, err := ReadWholeStream(r.Body, func(r io.Reader) (*vgpuimage.Image, vgpuimage.StreamInfo, error) {
		return a.ReadMigration(uint32(domid), r)
	})
	if err == nil {
		var ri RestoreInfo
		if ri, err = a.RegisterImage(uint32(domid), img); err == nil {
			writeJSON(w, http.StatusOK, MigrateInResult{Restore: ri, Bytes: info.Bytes, Records: info.Records})
			return
		}
	}
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
}

// ReadWholeStream reads a stream from body with read and refuses one
// followed by anything: a request's body is the stream alone.
func ReadWholeStream(body io.Reader, read func(io.Reader) (*vgpuimage.Image, vgpuimage.StreamInfo, error)) (*vgpuimage.Image, vgpuimage.StreamInfo, error) {
	img, info, err := read(body)
	if err != nil {
		return nil, info, err
	}
	var one [1]byte
	if n, _ := io.ReadFull(body, one[:]); n != 0 {
		img.Scrub()
		return nil, info, fmt.Errorf("%w: bytes after the migration stream's end", ErrImageRefused)
	}
	return img, info, nil
}
