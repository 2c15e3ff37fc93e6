//go:build linux && amd64

package bpftrace

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/gpuvm/gpuvm/internal/probe"
)

// objects are the loaded programs and maps the tracer uses.
type objects struct {
	TrapBegin  *ebpf.Program `ebpf:"trap_begin"`
	TrapEnd    *ebpf.Program `ebpf:"trap_end"`
	Release    *ebpf.Program `ebpf:"release"`
	Hists      *ebpf.Map     `ebpf:"hists"`
	CPUNs      *ebpf.Map     `ebpf:"cpu_ns"`
	LastSwitch *ebpf.Map     `ebpf:"last_switch"`
	Stats      *ebpf.Map     `ebpf:"stats"`
	TrapStarts *ebpf.Map     `ebpf:"trap_starts"`
}

func (o *objects) close() error {
	var errs []error
	for _, p := range []*ebpf.Program{o.TrapBegin, o.TrapEnd, o.Release} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	for _, m := range []*ebpf.Map{o.Hists, o.CPUNs, o.LastSwitch, o.Stats, o.TrapStarts} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// Tracer is the BPF programs attached to one daemon. Its methods are not
// safe for concurrent use.
type Tracer struct {
	exe      string
	objs     objects
	sched    *ebpf.Program // the sched_switch program attached, if any
	links    []link.Link
	schedVia string
	// cpu is the last on-CPU time read for each process watched now or
	// before (a process no longer watched keeps its last reading).
	cpu     map[uint32]uint64
	watched map[uint32]bool
}

// Attach loads the BPF programs and attaches them to the daemon opts.PID
// (uprobes on its probe points, and unless opts.NoCPU the sched_switch
// tracepoint). The daemon keeps running throughout. On error nothing stays
// attached or loaded.
func Attach(opts Options) (_ *Tracer, err error) {
	if opts.PID <= 0 {
		return nil, fmt.Errorf("bpftrace: no daemon process id")
	}
	if err := CheckPrivileges(); err != nil {
		return nil, err
	}
	t := &Tracer{exe: opts.Exe, cpu: map[uint32]uint64{}, watched: map[uint32]bool{}}
	if t.exe == "" {
		t.exe = fmt.Sprintf("/proc/%d/exe", opts.PID)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
		}
	}()
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones
	// (memory cgroups) need nothing and this does nothing.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, explain("raising RLIMIT_MEMLOCK for BPF maps", err)
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(object))
	if err != nil {
		return nil, fmt.Errorf("bpftrace: reading the embedded BPF object: %w", err)
	}
	v := spec.Variables[varTargetTGID]
	if v == nil {
		return nil, fmt.Errorf("bpftrace: the BPF object has no %s", varTargetTGID)
	}
	if err := v.Set(uint32(opts.PID)); err != nil {
		return nil, fmt.Errorf("bpftrace: setting %s: %w", varTargetTGID, err)
	}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, explain("loading the BPF programs and maps", err)
	}
	if _, err := os.Stat(t.exe); err != nil {
		hint := fmt.Sprintf("is process %d running?", opts.PID)
		if errors.Is(err, os.ErrPermission) {
			hint = "a process of another user namespace?"
		}
		return nil, fmt.Errorf("bpftrace: the daemon's executable: %w (%s)", err, hint)
	}
	ex, err := link.OpenExecutable(t.exe)
	if err != nil {
		return nil, fmt.Errorf("bpftrace: opening the daemon's executable: %w", err)
	}
	probes := []struct {
		sym  string
		prog *ebpf.Program
	}{{probe.SymTrapBegin, t.objs.TrapBegin}, {probe.SymTrapEnd, t.objs.TrapEnd}, {probe.SymRelease, t.objs.Release}}
	var syms []string
	for _, p := range probes {
		syms = append(syms, p.sym)
	}
	offsets, err := goFuncOffsets(t.exe, syms, []byte(probe.Marker))
	if err != nil {
		return nil, fmt.Errorf("bpftrace: finding the probe points in %s (process %d): %w", t.exe, opts.PID, err)
	}
	for _, p := range probes {
		off, ok := offsets[p.sym]
		if !ok {
			return nil, explainUprobe(t.exe, p.sym, fmt.Errorf("function %s: %w", p.sym, link.ErrNoSymbol))
		}
		// The file offset found above: the uprobe goes on the NOP of the
		// assembly function, not on the wrapper of the same name.
		l, err := ex.Uprobe(p.sym, p.prog, &link.UprobeOptions{PID: opts.PID, Address: off})
		if err != nil {
			return nil, explainUprobe(t.exe, p.sym, err)
		}
		t.links = append(t.links, l)
	}
	if !opts.NoCPU {
		if err := t.attachSched(spec); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// attachSched attaches the sched_switch program: through tracefs if it is
// mounted, else as a raw tracepoint (which needs no tracefs).
func (t *Tracer) attachSched(spec *ebpf.CollectionSpec) error {
	shared := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{"cpu_ns": t.objs.CPUNs, "last_switch": t.objs.LastSwitch}}
	var tpErr error
	if dir, ok := TracefsDir(); ok {
		var p struct {
			P *ebpf.Program `ebpf:"sched_switch"`
		}
		if err := spec.LoadAndAssign(&p, shared); err != nil {
			tpErr = explain("loading the sched_switch tracepoint program", err)
		} else if l, err := link.Tracepoint("sched", "sched_switch", p.P, nil); err != nil {
			p.P.Close()
			tpErr = explain("attaching to tracepoint sched/sched_switch (tracefs at "+dir+")", err)
		} else {
			t.sched, t.links, t.schedVia = p.P, append(t.links, l), "tracepoint sched/sched_switch"
			return nil
		}
	} else {
		tpErr = ErrNoTracefs
	}
	var p struct {
		P *ebpf.Program `ebpf:"sched_switch_raw"`
	}
	if err := spec.LoadAndAssign(&p, shared); err != nil {
		return fmt.Errorf("device-model CPU time: %w; and as a raw tracepoint: %w", tpErr, explain("loading the raw tracepoint program", err))
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_switch", Program: p.P})
	if err != nil {
		p.P.Close()
		return fmt.Errorf("device-model CPU time: %w; and as a raw tracepoint: %w", tpErr, explain("attaching raw tracepoint sched_switch", err))
	}
	t.sched, t.links = p.P, append(t.links, l)
	t.schedVia = "raw tracepoint sched_switch"
	if errors.Is(tpErr, ErrNoTracefs) {
		t.schedVia += " (tracefs is not mounted)"
	} else {
		t.schedVia += fmt.Sprintf(" (the tracepoint failed: %v)", tpErr)
	}
	return nil
}

// SchedVia says how on-CPU time is traced ("" if it is not).
func (t *Tracer) SchedVia() string { return t.schedVia }

// Watch sets the processes whose on-CPU time is counted from now on.
// A process no longer named stops being counted; its time so far stays in
// later snapshots.
func (t *Tracer) Watch(pids []int) error {
	want := map[uint32]bool{}
	for _, p := range pids {
		if p > 0 {
			want[uint32(p)] = true
		}
	}
	var errs []error
	for pid := range t.watched {
		if want[pid] {
			continue
		}
		var ns uint64
		if err := t.objs.CPUNs.Lookup(pid, &ns); err == nil {
			t.cpu[pid] = ns
		}
		if err := t.objs.CPUNs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("bpftrace: forgetting process %d: %w", pid, err))
		}
		delete(t.watched, pid)
	}
	for pid := range want {
		if t.watched[pid] {
			continue
		}
		// Counting resumes from the last reading of a process seen before.
		if err := t.objs.CPUNs.Update(pid, t.cpu[pid], ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = append(errs, fmt.Errorf("bpftrace: watching process %d: %w", pid, err))
			continue
		}
		t.watched[pid] = true
	}
	return errors.Join(errs...)
}

// Snapshot reads the counters as they are now. They only grow: what
// happened between two snapshots is the later one's Sub of the earlier.
func (t *Tracer) Snapshot() (Snapshot, error) {
	s := Snapshot{At: time.Now(), Hists: map[HistKey]Hist{}}
	var (
		k HistKey
		h Hist
	)
	it := t.objs.Hists.Iterate()
	for it.Next(&k, &h) {
		s.Hists[k] = h
	}
	if err := it.Err(); err != nil {
		return s, fmt.Errorf("bpftrace: reading the histograms: %w", err)
	}
	for pid := range t.watched {
		var ns uint64
		if err := t.objs.CPUNs.Lookup(pid, &ns); err == nil {
			t.cpu[pid] = ns
		}
	}
	s.CPUNs = maps.Clone(t.cpu)
	for i, dst := range []*uint64{&s.Stats.UnmatchedEnds, &s.Stats.HistFull, &s.Stats.BadReads} {
		if err := t.objs.Stats.Lookup(uint32(i), dst); err != nil {
			return s, fmt.Errorf("bpftrace: reading the drop counters: %w", err)
		}
	}
	return s, nil
}

// Close detaches every probe and frees the programs and maps. The daemon
// is left as it was before Attach.
func (t *Tracer) Close() error {
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	t.links = nil
	if t.sched != nil {
		errs = append(errs, t.sched.Close())
		t.sched = nil
	}
	errs = append(errs, t.objs.close())
	t.objs = objects{}
	return errors.Join(errs...)
}

// programIDs are the kernel's ids of the loaded programs (a test checks
// they are gone after Close).
func (t *Tracer) programIDs() []ebpf.ProgramID {
	var ids []ebpf.ProgramID
	for _, p := range []*ebpf.Program{t.objs.TrapBegin, t.objs.TrapEnd, t.objs.Release, t.sched} {
		if p == nil {
			continue
		}
		if info, err := p.Info(); err == nil {
			if id, ok := info.ID(); ok {
				ids = append(ids, id)
			}
		}
	}
	return ids
}
