// Package workloads holds the GPUvm evaluation's micro-benchmarks (thesis
// Table 4.2) as guest programs on the gdev runtime: nop, loop, madd, mmul,
// fmadd, fmmul, cpy and pincpy. Each run times the phases of Fig. 4.9 (init,
// htod, launch, dtoh, close) and verifies its result against a host reference.
package workloads

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/gpuvm/gpuvm/guest-driver/gdev"
)

// Phase names, in order.
const (
	PhaseInit   = "init"
	PhaseHtoD   = "htod"
	PhaseLaunch = "launch"
	PhaseDtoH   = "dtoh"
	PhaseClose  = "close"
)

// PhaseNames lists the phases in order.
func PhaseNames() []string {
	return []string{PhaseInit, PhaseHtoD, PhaseLaunch, PhaseDtoH, PhaseClose}
}

// Phases is how long each phase of one run took.
type Phases struct {
	Init, HtoD, Launch, DtoH, Close time.Duration
}

// Total is the sum of the phases.
func (p Phases) Total() time.Duration { return p.Init + p.HtoD + p.Launch + p.DtoH + p.Close }

// Get returns the named phase.
func (p Phases) Get(name string) time.Duration {
	switch name {
	case PhaseInit:
		return p.Init
	case PhaseHtoD:
		return p.HtoD
	case PhaseLaunch:
		return p.Launch
	case PhaseDtoH:
		return p.DtoH
	case PhaseClose:
		return p.Close
	}
	return 0
}

// Params size the workloads. The zero value takes the thesis' sizes.
type Params struct {
	MatrixDim      int    // n of the n×n matrices; default 1024
	LoopIterations uint64 // loop kernel iterations; default 1<<24
	CopyBytes      uint64 // cpy/pincpy transfer size; default 64 MiB
}

func (p Params) withDefaults() Params {
	if p.MatrixDim == 0 {
		p.MatrixDim = 1024
	}
	if p.LoopIterations == 0 {
		p.LoopIterations = 1 << 24
	}
	if p.CopyBytes == 0 {
		p.CopyBytes = 64 << 20
	}
	return p
}

// Workload is one benchmark program. Prepare builds inputs and the expected
// output once; Run executes one timed run on dev and verifies it.
type Workload interface {
	Name() string
	Description() string
	Run(drv gdev.Driver) (Phases, error)
}

type factory struct {
	name, desc string
	make       func(Params) Workload
}

func registry() []factory {
	return []factory{
		{"nop", "launch an empty kernel", func(p Params) Workload { return &nopWorkload{} }},
		{"loop", "launch a kernel that spins", func(p Params) Workload { return &loopWorkload{iters: p.LoopIterations} }},
		{"madd", "n×n uint32 matrix addition", func(p Params) Workload { return newMatrix("madd", p.MatrixDim, false, false) }},
		{"mmul", "n×n uint32 matrix multiplication", func(p Params) Workload { return newMatrix("mmul", p.MatrixDim, true, false) }},
		{"fmadd", "n×n float32 matrix addition", func(p Params) Workload { return newMatrix("fmadd", p.MatrixDim, false, true) }},
		{"fmmul", "n×n float32 matrix multiplication", func(p Params) Workload { return newMatrix("fmmul", p.MatrixDim, true, true) }},
		{"cpy", "host→device→host copy of pageable memory", func(p Params) Workload { return &copyWorkload{size: p.CopyBytes} }},
		{"pincpy", "host→device→host copy of pinned memory", func(p Params) Workload { return &copyWorkload{size: p.CopyBytes, pinned: true} }},
	}
}

// Names lists the workloads in the thesis' order.
func Names() []string {
	var n []string
	for _, f := range registry() {
		n = append(n, f.name)
	}
	return n
}

// Describe returns a workload's one-line description.
func Describe(name string) string {
	for _, f := range registry() {
		if f.name == name {
			return f.desc
		}
	}
	return ""
}

// New returns the named workload sized by p.
func New(name string, p Params) (Workload, error) {
	p = p.withDefaults()
	if p.MatrixDim < 1 || p.MatrixDim > 4096 {
		return nil, fmt.Errorf("matrix dimension %d out of range 1..4096", p.MatrixDim)
	}
	for _, f := range registry() {
		if f.name == name {
			return f.make(p), nil
		}
	}
	return nil, fmt.Errorf("unknown workload %q (have %v)", name, Names())
}

// Parse expands a comma-separated list ("all" for every workload).
func Parse(list string) ([]string, error) {
	var out []string
	for _, name := range splitList(list) {
		if name == "all" {
			out = append(out, Names()...)
			continue
		}
		if !slices.Contains(Names(), name) {
			return nil, fmt.Errorf("unknown workload %q (have all, %v)", name, Names())
		}
		out = append(out, name)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no workloads given")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if f := trim(s[start:i]); f != "" {
				out = append(out, f)
			}
			start = i + 1
		}
	}
	return out
}

func trim(s string) string {
	for len(s) > 0 && s[0] == ' ' {
		s = s[1:]
	}
	for len(s) > 0 && s[len(s)-1] == ' ' {
		s = s[:len(s)-1]
	}
	return s
}

// timer measures consecutive phases.
type timer struct{ last time.Time }

func newTimer() *timer { return &timer{last: time.Now()} }

func (t *timer) lap(d *time.Duration) {
	now := time.Now()
	*d = now.Sub(t.last)
	t.last = now
}

// skip restarts the clock, leaving the time since the last lap out of every phase.
func (t *timer) skip() { t.last = time.Now() }

// Median returns the median of durations (the mean of the middle two for an even count).
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// rng returns a deterministic generator so every run and mode sees the same inputs.
func rng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }
