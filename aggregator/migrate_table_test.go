package aggregator

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// migrateTable asks TestMigrateDowntimeTable for its table
// (docs/performance.md, "Live migration").
var (
	migrateTable = flag.Bool("migrate.table", false, "measure live migration's downtime and total time over VRAM in use and GPU write rates (docs/performance.md)")
	migrateSizes = flag.String("migrate.sizes", "16,64,192", "with -migrate.table: the MiB of VRAM in use, comma-separated (at most 192)")
)

// bulkBase is where the table's VRAM in use starts in the slot: above
// what the guest driver allocates.
const bulkBase = 32 << 20

// gpuWriter writes random 64 KiB blocks of v's bulk region at a rate, as
// its GPU's engines would (through the board's copy path, no BAR, no
// trap), while v is resident, and keeps what each block should hold.
type gpuWriter struct {
	v      *VGPU
	mover  VRAMMover
	shadow []byte // the bulk region as written
	rate   float64
	stop   chan struct{}
	wg     sync.WaitGroup
	wrote  uint64
	// achieved is the rate the writes reached until the park (or the
	// stop): the machine may not keep up with rate.
	achieved float64
}

const writeBlock = 64 << 10

// fill writes all of the bulk region once.
func (g *gpuWriter) fill(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range g.shadow {
		g.shadow[i] = byte(r.Uint32())
	}
	for off := 0; off < len(g.shadow); off += moveChunk {
		if !g.write(off, g.shadow[off:off+moveChunk]) {
			t.Fatal("the vGPU is not resident")
		}
	}
}

// write copies p to the bulk region at off if v is resident (under v.mu:
// an eviction's copy-out sees all of it or none).
func (g *gpuWriter) write(off int, p []byte) bool {
	v := g.v
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead || v.image != nil {
		return false
	}
	return g.mover.ImportVRAM(p, v.Slot.VRAM.Base+bulkBase+uint64(off)) == nil
}

// run writes at g.rate bytes a second until stopped.
func (g *gpuWriter) run() {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if g.rate == 0 {
			return
		}
		r := rand.New(rand.NewPCG(3, 4))
		start := time.Now()
		defer func() {
			if g.achieved == 0 {
				g.achieved = float64(g.wrote) / time.Since(start).Seconds()
			}
		}()
		block := make([]byte, writeBlock)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-g.stop:
				return
			case <-tick.C:
			}
			for float64(g.wrote) < g.rate*time.Since(start).Seconds() {
				off := r.IntN(len(g.shadow)/writeBlock) * writeBlock
				for i := range block {
					block[i] = byte(r.Uint32())
				}
				if !g.write(off, block) {
					if g.achieved == 0 {
						g.achieved = float64(g.wrote) / time.Since(start).Seconds()
					}
					break // parked: the guest is paused
				}
				copy(g.shadow[off:], block)
				g.wrote += writeBlock
			}
		}
	}()
}

// migrateRow is one migration of a VM with inUse bytes of bulk VRAM
// written at rate bytes a second by its GPU, with opts.
type migrateRow struct {
	inUse, rate uint64
	opts        MigrateOptions
	st          MigrateStats
	attach      time.Duration
	achieved    float64
}

func (row *migrateRow) run(t *testing.T) {
	src, _ := newTestAggregator(t, 2)
	dst, dstBoard := newTestAggregator(t, 2)
	s := startSavable(t, src, 5, "bench", "fv-optimized")
	w := &gpuWriter{v: s.v, mover: src.gpu.(VRAMMover), shadow: make([]byte, row.inUse), rate: float64(row.rate), stop: make(chan struct{})}
	w.fill(t)
	w.run()
	time.Sleep(50 * time.Millisecond) // the writes under way
	st, err := migrateVia(t, src, dst, s.v, 5, row.opts, nil)
	close(w.stop)
	w.wg.Wait()
	row.achieved = w.achieved
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	row.st = st
	t0 := time.Now()
	nv := attachRAM(t, dst, s.g, s.ram) // the device model's resume: the image restored into a slot
	row.attach = time.Since(t0)
	got := make([]byte, len(w.shadow))
	if err := dstBoard.ExportVRAM(got, nv.Slot.VRAM.Base+bulkBase); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, w.shadow) {
		n := 0
		for off := 0; off < len(got); off += 4096 {
			if !bytes.Equal(got[off:off+4096], w.shadow[off:off+4096]) {
				n++
			}
		}
		t.Fatalf("%d MiB at %d MiB/s: %d pages on the destination differ from what the GPU wrote", row.inUse>>20, row.rate>>20, n)
	}
}

// TestMigrateDowntimeTable measures live migration (in one process: two
// aggregators on two simulated boards, the stream through a pipe) for
// several amounts of VRAM in use and rates at which the VM's GPU rewrites
// it during the migration, and checks every time that the destination's
// slot holds exactly what the GPU wrote before the park. Downtime is from
// the park to the destination holding the image (the source's view) plus
// the restore into a slot there (the device model's resume; its
// reconnect, about 10–30 ms in TestMigrateAcrossDaemons, is not in it).
//
//	go test ./aggregator/ -run TestMigrateDowntimeTable -migrate.table -v
func TestMigrateDowntimeTable(t *testing.T) {
	if !*migrateTable {
		t.Skip("a measurement: go test ./aggregator/ -run TestMigrateDowntimeTable -migrate.table -v")
	}
	var rows []*migrateRow
	for _, f := range strings.Split(*migrateSizes, ",") {
		mib, err := strconv.ParseUint(f, 10, 64)
		if err != nil || mib == 0 || mib > 192 {
			t.Fatalf("-migrate.sizes: %q: want 1..192 MiB", f)
		}
		rows = append(rows, &migrateRow{inUse: mib << 20, opts: MigrateOptions{MaxRounds: -1}})
		for _, rate := range []uint64{0, 64, 256, 1024} {
			rows = append(rows, &migrateRow{inUse: mib << 20, rate: rate << 20})
		}
	}
	// A first migration warms the process (its page faults, the
	// simulator's first allocations) and is not reported.
	(&migrateRow{inUse: 16 << 20}).run(t)
	var b strings.Builder
	fmt.Fprintf(&b, "\n| VRAM in use | GPU writes | pre-copy rounds (MiB each) | sent after the park | pause (park, copy-out) | downtime to the destination's ok | + restore there | downtime | total |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|\n")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
	for _, row := range rows {
		row.run(t)
		st := row.st
		var rounds []string
		for _, r := range st.Rounds {
			rounds = append(rounds, fmt.Sprintf("%.1f", float64(r.Bytes)/(1<<20)))
		}
		rate := fmt.Sprintf("%d MiB/s (%.0f reached)", row.rate>>20, row.achieved/(1<<20))
		if row.opts.MaxRounds < 0 {
			rate, rounds = "none, stop-and-copy only", []string{"none"}
		}
		fmt.Fprintf(&b, "| %d MiB | %s | %d (%s) | %.1f MiB | %s | %s | %s | %s | %s |\n", st.InUse>>20, rate, len(st.Rounds), strings.Join(rounds, ", "),
			float64(st.FinalBytes)/(1<<20), ms(st.PauseNs), ms(st.DowntimeNs), ms(row.attach), ms(st.DowntimeNs+row.attach), ms(st.TookNs+row.attach))
	}
	t.Log(b.String())
}
