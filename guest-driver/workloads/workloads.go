// Package workloads holds the GPUvm evaluation's benchmarks (thesis Table
// 4.2) as guest programs on the gdev runtime: the micro-benchmarks nop, loop,
// madd, mmul, fmadd, fmmul, cpy and pincpy, and the Rodinia-like bp, hs, lud,
// nn, srad and srad2. Each run times the phases of Fig. 4.9 (init, htod,
// launch, dtoh, close) and verifies its result against a host reference.
//
// Sizes (Params' zero value):
//
//	nop     one empty kernel.
//	loop    one kernel of 2^24 generator steps (LoopIterations).
//	madd, mmul, fmadd, fmmul
//	        1024×1024 matrices (MatrixDim).
//	cpy, pincpy
//	        64 MiB each way (CopyBytes).
//	bp      back propagation, one training step of a network of 65,536 inputs,
//	        16 hidden units and 1 output (Rodinia's default run, backprop
//	        65536): bp_layerforward, then the output and hidden errors on the
//	        host, then bp_adjust_weights; 2 launches.
//	hs      hotspot on a 512×512 grid (the size of Rodinia's temp_512 and
//	        power_512 inputs; synthetic values), 24 iterations as 12
//	        launches of a pyramid 2 iterations high.
//	lud     LU decomposition of a diagonally dominant 512×512 matrix (the
//	        size of Rodinia's 512.dat) in 16-wide block steps: diagonal,
//	        perimeter and internal kernels per step and a last diagonal, 94
//	        launches.
//	nn      the distances of 42,764 synthetic (latitude, longitude) records
//	        (about the size of Rodinia's default input) to (30, 90) in one
//	        kernel; the 5 nearest are picked on the host, as Rodinia does.
//	srad    srad_v1 on a 502×458 image (Rodinia's default size; a synthetic
//	        speckled image instead of its ultrasound picture): extract, then
//	        per iteration srad_reduce, the two sums back to the host for the
//	        speckle scale, srad_coeff and srad_update, then compress; 20
//	        iterations (Rodinia runs 100), λ 0.5: 62 launches and 20 small
//	        copies back.
//	srad2   srad_v2 on a 1024×1024 image of exp(uniform[0, 1)) pixels
//	        (Rodinia's default run is 2048×2048): per iteration the speckle
//	        scale of the region rows 0–127, columns 0–127 on the host, the
//	        image to the device, srad_coeff and srad_update, and the image
//	        back; 2 iterations, λ 0.5.
//
// srad's iteration count and srad2's image are smaller than Rodinia's
// default runs, and hs's iteration count is chosen, so that each Rodinia-like
// workload runs for roughly 20–200 ms natively on the simulated board with
// the fermi timing (its kernels compute for real on the host's CPU); madd
// takes about 40 ms.
//
// Params.RodiniaScale divides the linear sizes of the Rodinia-like workloads
// (bp's inputs, hs's, srad's and srad2's rows and columns, lud's n, nn's
// records; at least 4 rows and columns, 16 inputs or records) but not their
// iteration counts, so scaled-down runs keep their launch structure.
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
	if f := p.field(name); f != nil {
		return *f
	}
	return 0
}

// Params size the workloads. The zero value takes the thesis' sizes.
type Params struct {
	MatrixDim      int    // n of the n×n matrices; default 1024
	LoopIterations uint64 // loop kernel iterations; default 1<<24
	CopyBytes      uint64 // cpy/pincpy transfer size; default 64 MiB
	// RodiniaScale divides the linear sizes of bp, hs, lud, nn, srad and
	// srad2 (1..MaxRodiniaScale; 0 means 1, Rodinia's sizes), so that tests
	// and CI can run small versions.
	RodiniaScale int
}

// MaxRodiniaScale bounds Params.RodiniaScale.
const MaxRodiniaScale = 256

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
	if p.RodiniaScale == 0 {
		p.RodiniaScale = 1
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
		{"bp", "Rodinia back propagation: one training step, 65536 inputs × 16 hidden units, 2 kernels", func(p Params) Workload { return newBP(rodiniaSizes(p.RodiniaScale)) }},
		{"hs", "Rodinia hotspot: 512×512 grid, 24 iterations in 12 launches", func(p Params) Workload { return newHotspot(rodiniaSizes(p.RodiniaScale)) }},
		{"lud", "Rodinia LU decomposition: 512×512 float32 matrix, 94 launches", func(p Params) Workload { return newLUD(rodiniaSizes(p.RodiniaScale)) }},
		{"nn", "Rodinia nearest neighbour: 42764 records, 5 nearest", func(p Params) Workload { return newNN(rodiniaSizes(p.RodiniaScale)) }},
		{"srad", "Rodinia srad_v1: 502×458 image, 20 iterations of 3 kernels", func(p Params) Workload { return newSrad(rodiniaSizes(p.RodiniaScale)) }},
		{"srad2", "Rodinia srad_v2: 1024×1024 random image, 2 iterations of 2 kernels", func(p Params) Workload { return newSrad2(rodiniaSizes(p.RodiniaScale)) }},
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
	if p.RodiniaScale < 1 || p.RodiniaScale > MaxRodiniaScale {
		return nil, fmt.Errorf("rodinia scale %d out of range 1..%d", p.RodiniaScale, MaxRodiniaScale)
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

// timer measures consecutive phases of a run into ph, telling obs (if not
// nil) as each one ends.
type timer struct {
	last time.Time
	ph   *Phases
	obs  PhaseObserver
}

func newTimer() *timer { return &timer{last: time.Now()} }

func (t *timer) lap(d *time.Duration) {
	now := time.Now()
	*d = now.Sub(t.last)
	t.last = now
	t.observe(d)
}

// add adds the time since the last lap to *d: for a phase a run enters more
// than once (srad2 copies its image each way every iteration).
func (t *timer) add(d *time.Duration) {
	now := time.Now()
	*d += now.Sub(t.last)
	t.last = now
	t.observe(d)
}

// observe tells the observer that the phase d is ended; the observer's own
// time is left out of every phase.
func (t *timer) observe(d *time.Duration) {
	if t.obs == nil || t.ph == nil {
		return
	}
	for _, name := range PhaseNames() {
		if t.ph.field(name) == d {
			t.obs(name)
			break
		}
	}
	t.last = time.Now()
}

// PhaseObserver is told the name of each phase of a run as it ends.
type PhaseObserver func(phase string)

// observedDriver is a driver whose workload runs tell obs as each phase
// ends (see Observe).
type observedDriver struct {
	gdev.Driver
	obs PhaseObserver
}

// Observe returns drv with obs attached: a workload run on the returned
// driver calls obs with the name of each phase as it ends (a phase a run
// enters more than once, each time), after timing it, so that obs's own
// time counts in no phase. The benchmarks use it to attribute trap counts
// to phases (thesis Fig. 4.4, 4.5).
func Observe(drv gdev.Driver, obs PhaseObserver) gdev.Driver {
	return observedDriver{Driver: drv, obs: obs}
}

// field returns the address of the named phase.
func (p *Phases) field(name string) *time.Duration {
	switch name {
	case PhaseInit:
		return &p.Init
	case PhaseHtoD:
		return &p.HtoD
	case PhaseLaunch:
		return &p.Launch
	case PhaseDtoH:
		return &p.DtoH
	case PhaseClose:
		return &p.Close
	}
	return nil
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
