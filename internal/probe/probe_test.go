package probe

import (
	"reflect"
	"runtime"
	"sync"
	"testing"
)

// The tracer finds the probe points by these names.
func TestSymbols(t *testing.T) {
	for sym, fn := range map[string]any{SymTrapBegin: TrapBegin, SymTrapEnd: TrapEnd, SymRelease: Release} {
		if got := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name(); got != sym {
			t.Errorf("function %s is named %q in the executable", sym, got)
		}
	}
}

// access stands for (*VGPU).Read32's shape: a lock held across a little
// work, with or without the probe calls the aggregator makes.
type access struct {
	mu sync.Mutex
	n  uint64
}

//go:noinline
func (a *access) plain(bar int) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n += uint64(bar)
	return a.n
}

//go:noinline
func (a *access) probed(id, bar int) uint64 {
	TrapBegin(id, bar, false)
	defer TrapEnd(id)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n += uint64(bar)
	return a.n
}

// BenchmarkProbe is one probe point's cost with no uprobe attached.
func BenchmarkProbe(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		Release(i&7, int64(i))
	}
}

// BenchmarkAccess compares an access without probes, with TrapBegin and a
// deferred TrapEnd as Read32 and Write32 have them, and the dispatcher's
// Release.
func BenchmarkAccess(b *testing.B) {
	var a access
	b.Run("plain", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			a.plain(i & 3)
		}
	})
	b.Run("probed", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			a.probed(1, i&3)
		}
	})
}
