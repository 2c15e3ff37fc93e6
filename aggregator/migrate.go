package aggregator

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"time"

	"github.com/gpuvm/gpuvm/gpu"
	"github.com/gpuvm/gpuvm/ipc"
	"github.com/gpuvm/gpuvm/vgpuimage"
)

// Live migration of a vGPU to another daemon (issue 18; docs/design.md,
// "Live migration"; the stream is docs/protocol.md §14). While the guest
// runs, rounds of pre-copy read every VRAM page of the slot in use
// straight off the board and send the pages whose content differs from
// what was sent before (round 0: all of them). A Fermi keeps no dirty
// bits — not in its page tables, not for BAR writes, not for its engines'
// writes — so the only witness of a change is the content: each page's
// digest (hash/maphash under a seed drawn for this migration, which the
// guest never sees, so it cannot make two contents collide on purpose) is
// kept for what was sent, and a page whose digest differs was written
// since, by whoever: a BAR1/BAR3 write trapped or through a remapped page,
// the GPU's engines on any channel, a DMA. Rounds stop when one sends at
// most Options.TargetBytes, sends no less than the one before (the guest
// writes as fast as it is sent), or after MaxRounds. Then the stop: the
// vGPU is parked by the eviction path (a submission boundary, as Save
// does, holding restoreMu so that nothing brings it back), its slot's
// pages, now in the parked image, are compared with what was sent once
// more, the changed ones and the state image without pages follow, and
// the stream ends. Only when the destination says it holds the image is
// the vGPU destroyed (its device model told, as at a save, that it resumes
// elsewhere); on any failure before that it stays here, parked, and its
// guest's next access brings it back: a failed migration never takes the
// guest's GPU.

// MigrateReason is the Bye a migrated vGPU's device model gets: like a
// save's, it begins ipc.ByeSaved, so the device model resumes on the
// destination (docs/protocol.md §13.7).
const MigrateReason = ipc.ByeSaved + "vGPU migrated to another daemon (gpuvm vgpu migrate); it resumes where the stream was received"

// ErrMigrating is returned when a migration of the vGPU is already under
// way.
var ErrMigrating = errors.New("a migration of this vGPU is already under way")

// Defaults of MigrateOptions.
const (
	DefaultMigrateRounds = 8
	DefaultMigrateTarget = 2 << 20
	// MaxMigrateRounds bounds the rounds whatever is asked: each reads
	// all VRAM in use.
	MaxMigrateRounds = 32
	// MigrateTimeout bounds a whole migration through the control API.
	MigrateTimeout = 30 * time.Minute
)

// MigrateOptions tunes the pre-copy.
type MigrateOptions struct {
	// MaxRounds bounds the rounds after round 0 (negative: no pre-copy
	// at all, a plain stop-and-copy, for comparison); TargetBytes is the
	// round size at which the pre-copy has converged. Zero: the defaults.
	MaxRounds   int
	TargetBytes uint64
}

func (o MigrateOptions) withDefaults() MigrateOptions {
	if o.MaxRounds == 0 {
		o.MaxRounds = DefaultMigrateRounds
	}
	o.MaxRounds = min(o.MaxRounds, MaxMigrateRounds)
	if o.TargetBytes == 0 {
		o.TargetBytes = DefaultMigrateTarget
	}
	return o
}

// MigrateRound is one pre-copy round.
type MigrateRound struct {
	Bytes  uint64        `json:"bytes"`
	TookNs time.Duration `json:"took_ns"`
}

// MigrateStats describes a migration.
type MigrateStats struct {
	Rounds []MigrateRound `json:"rounds"`
	// InUse is the VRAM in use at the stop; FinalBytes the part of it
	// sent after the park; StreamBytes the whole stream.
	InUse       uint64 `json:"in_use"`
	FinalBytes  uint64 `json:"final_bytes"`
	StreamBytes uint64 `json:"stream_bytes"`
	// Pause is the eviction's park and copy-out; Downtime from the park
	// until the destination's answer (and the vGPU's teardown here);
	// Took the whole migration.
	PauseNs    time.Duration `json:"pause_ns"`
	DowntimeNs time.Duration `json:"downtime_ns"`
	TookNs     time.Duration `json:"took_ns"`
}

// migration is one vGPU's migration under way.
type migration struct {
	v    *VGPU
	seed maphash.Seed
	// sent is the digest of each page (offset from the slot's base) as
	// the destination last received it.
	sent map[uint64]uint64
	// token, verdict and done connect the control API's two requests
	// (migrate_serve.go); unused by a caller of Migrate.
	token   string
	verdict chan error
	done    chan migrateResult
	// stopping, if set, is called just before the park: the control API
	// bounds there how long the rest of the stream may take to write, so
	// that a relay that stops reading cannot keep the vGPU parked.
	stopping func()
}

type migrateResult struct {
	st  MigrateStats
	err error
}

func newMigration(v *VGPU) *migration {
	return &migration{v: v, seed: maphash.MakeSeed(), sent: map[uint64]uint64{}}
}

// errLeftSlot ends the pre-copy when the vGPU is no longer resident in the
// slot it started in (parked or moved meanwhile): the stop sends the rest.
var errLeftSlot = errors.New("the vGPU left its slot")

// Migrate sends v to w as a migration stream while it runs, parks it,
// sends the rest and calls commit, which says whether the destination
// took it. On success v is destroyed; on any error it stays attached here
// (parked, if it got that far: its guest's next access resumes it). ctx
// bounds the whole migration, but not a write to w: w must fail rather
// than block for long, since the guest waits while the rest is written.
func (a *Aggregator) Migrate(ctx context.Context, v *VGPU, w io.Writer, opts MigrateOptions, commit func(context.Context) error) (MigrateStats, error) {
	m := newMigration(v)
	if !v.migration.CompareAndSwap(nil, m) {
		return MigrateStats{}, fmt.Errorf("migrate vGPU %d: %w", v.ID, ErrMigrating)
	}
	defer v.migration.CompareAndSwap(m, nil)
	return a.migrate(ctx, m, w, opts, commit)
}

func (a *Aggregator) migrate(ctx context.Context, m *migration, w io.Writer, opts MigrateOptions, commit func(context.Context) error) (MigrateStats, error) {
	start := time.Now()
	v := m.v
	var st MigrateStats
	if err := pvdrmLeaves(v); err != nil {
		return st, fmt.Errorf("migrate %w", err)
	}
	_, slot := v.where()
	sw, err := vgpuimage.NewStreamWriter(w, slot.VRAM.Size)
	if err != nil {
		return st, err
	}
	if err := a.precopy(ctx, m, sw, opts.withDefaults(), &st); err != nil {
		return st, fmt.Errorf("migrate vGPU %d: pre-copy: %w", v.ID, err)
	}
	err = a.stopAndCopy(ctx, m, sw, commit, &st)
	st.StreamBytes, st.TookNs = sw.Bytes(), time.Since(start)
	if err != nil {
		return st, fmt.Errorf("migrate vGPU %d: %w", v.ID, err)
	}
	v.logger().Info("vGPU migrated", "rounds", len(st.Rounds), "in_use", st.InUse, "final_bytes", st.FinalBytes,
		"stream_bytes", st.StreamBytes, "pause", st.PauseNs, "downtime", st.DowntimeNs, "took", st.TookNs)
	return st, nil
}

// precopy sends rounds while the guest runs, until they converge.
func (a *Aggregator) precopy(ctx context.Context, m *migration, sw *vgpuimage.StreamWriter, opts MigrateOptions, st *MigrateStats) error {
	for round := 0; opts.MaxRounds >= 0; round++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		n, err := m.round(a, sw)
		if errors.Is(err, errLeftSlot) {
			return nil
		}
		if err != nil {
			return err
		}
		st.Rounds = append(st.Rounds, MigrateRound{Bytes: n, TookNs: time.Since(t0)})
		switch {
		case n <= opts.TargetBytes, round >= opts.MaxRounds:
			return nil
		case round > 0 && n >= st.Rounds[round-1].Bytes:
			return nil // not converging: the guest writes as fast as it is sent
		}
	}
	return nil
}

// round reads every page of v's slot in use and sends those whose content
// changed since they were last sent. The board is read a chunk at a time
// under v.mu, so that the slot cannot be given to another vGPU meanwhile:
// the guest's trapped accesses wait at most one chunk's copy.
func (m *migration) round(a *Aggregator, sw *vgpuimage.StreamWriter) (uint64, error) {
	v := m.v
	out, ok := a.gpu.(VRAMMover)
	if !ok {
		return 0, fmt.Errorf("the board cannot copy VRAM: %w", ErrMoveUnsupported)
	}
	v.mu.Lock()
	slot, err := m.resident(a)
	var ranges []gpu.Range
	if err == nil {
		ranges, err = out.VRAMResidentRanges(slot.VRAM.Base, slot.VRAM.Size)
	}
	v.mu.Unlock()
	if err != nil {
		return 0, err
	}
	buf := make([]byte, moveChunk)
	defer clear(buf)
	var sent uint64
	for _, rg := range ranges {
		for off := rg.Base; off < rg.End(); {
			n := min(uint64(moveChunk), rg.End()-off)
			v.mu.Lock()
			now, err := m.resident(a)
			if err == nil && now.Index != slot.Index {
				err = errLeftSlot
			}
			if err == nil {
				err = out.ExportVRAM(buf[:n], off)
			}
			v.mu.Unlock()
			if err != nil {
				return sent, err
			}
			k, err := m.sendChanged(sw, off-slot.VRAM.Base, buf[:n])
			sent += k
			if err != nil {
				return sent, err
			}
			off += n
		}
	}
	return sent, nil
}

// resident is v's slot if v is resident on a. Called with v.mu held.
func (m *migration) resident(a *Aggregator) (Slot, error) {
	v := m.v
	switch {
	case v.dead:
		return Slot{}, ErrDetached
	case v.image != nil || v.agg != a || v.Slot.Index < 0:
		return Slot{}, errLeftSlot
	}
	return v.Slot, nil
}

// sendChanged sends the pages of data (the slot's VRAM at off) whose
// digest differs from what was last sent, in runs, and records them.
func (m *migration) sendChanged(sw *vgpuimage.StreamWriter, off uint64, data []byte) (uint64, error) {
	var sent uint64
	run := -1 // start of the run of changed pages, in data
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		err := sw.Pages(off+uint64(run), data[run:end])
		sent += uint64(end - run)
		run = -1
		return err
	}
	for p := 0; p+vgpuimage.PageSize <= len(data); p += vgpuimage.PageSize {
		d := maphash.Bytes(m.seed, data[p:p+vgpuimage.PageSize])
		if old, ok := m.sent[off+uint64(p)]; ok && old == d {
			if err := flush(p); err != nil {
				return sent, err
			}
			continue
		}
		m.sent[off+uint64(p)] = d
		if run < 0 {
			run = p
		}
	}
	return sent, flush(len(data) &^ (vgpuimage.PageSize - 1))
}

// stopAndCopy parks v, sends what changed since the last round, the
// ranges in use and the state image, and ends the stream; then, once
// commit says the destination holds it, destroys v. On an error before
// that v stays parked here.
func (a *Aggregator) stopAndCopy(ctx context.Context, m *migration, sw *vgpuimage.StreamWriter, commit func(context.Context) error, st *MigrateStats) error {
	v := m.v
	// A pvdrm back end stops between two requests first, as for a save;
	// it serves on once the vGPU is gone (it then stops) or stays.
	letGo, err := quiescePVDRM(ctx, v)
	if err != nil {
		return fmt.Errorf("stopping it: %w", err)
	}
	if letGo != nil {
		defer letGo()
	}
	// Nothing brings it back from the park until it is destroyed or the
	// migration failed (as in Save).
	v.restoreMu.Lock()
	defer v.restoreMu.Unlock()
	if m.stopping != nil {
		m.stopping()
	}
	cur, _ := v.where()
	park := time.Now()
	ectx, cancel := context.WithTimeout(ctx, cur.opts.Timeout)
	ev, err := cur.Evict(ectx, v, "migrating it to another daemon")
	cancel()
	if err != nil {
		return fmt.Errorf("parking it: %w", err)
	}
	st.PauseNs = ev.Took
	img, err := v.capture(true)
	if err != nil {
		return err
	}
	defer img.Scrub()
	var resident []vgpuimage.Range
	for _, p := range img.Pages {
		n, err := m.sendChanged(sw, p.Off, p.Data)
		st.FinalBytes += n
		if err != nil {
			return fmt.Errorf("sending its last pages (it stays parked here): %w", err)
		}
		st.InUse += uint64(len(p.Data))
		if k := len(resident) - 1; k >= 0 && resident[k].Off+resident[k].Len == p.Off {
			resident[k].Len += uint64(len(p.Data))
		} else {
			resident = append(resident, vgpuimage.Range{Off: p.Off, Len: uint64(len(p.Data))})
		}
	}
	state := *img
	state.Pages = nil
	if err := errors.Join(sw.Resident(resident), sw.Image(&state), sw.End()); err != nil {
		return fmt.Errorf("ending the stream (it stays parked here): %w", err)
	}
	if err := commit(ctx); err != nil {
		v.logger().Warn("migration not taken by the destination: the vGPU stays here, parked", "err", err)
		return fmt.Errorf("the destination did not take it (it stays here, parked): %w", err)
	}
	cur, _ = v.where()
	err = cur.Destroy(v, MigrateReason)
	st.DowntimeNs = time.Since(park)
	return err
}
