package kernels

import (
	"fmt"
	"math"
)

// This file holds what the Rodinia-like kernels (bp, hs, lud, nn, srad)
// share: parameter validation and float32 array transfers.

// array is one array parameter of a kernel: its name in errors, its GPU
// virtual address and its size in bytes.
type array struct {
	what string
	va   uint64
	size uint64
}

// checkArrays rejects, with ErrBadParams, an array whose address range wraps
// past 2^64. Sizes must be non-zero.
func checkArrays(name string, arrays ...array) error {
	for _, a := range arrays {
		if a.va > math.MaxUint64-(a.size-1) {
			return fmt.Errorf("%s: array %s at %#x (%d bytes) wraps the address space: %w", name, a.what, a.va, a.size, ErrBadParams)
		}
	}
	return nil
}

// checkCount rejects, with ErrBadParams, a dimension or count v outside
// [1, limit].
func checkCount(name, what string, v, limit uint64) error {
	if v == 0 || v > limit {
		return fmt.Errorf("%s: %s %d not in [1, %d]: %w", name, what, v, limit, ErrBadParams)
	}
	return nil
}

// f32Param decodes the float32 scalar carried in parameter word w (see
// nvc0.F32Word); a word with any of its high 32 bits set is rejected with
// ErrBadParams.
func f32Param(name, what string, w uint64) (float32, error) {
	if w>>32 != 0 {
		return 0, fmt.Errorf("%s: float32 parameter %s is %#x, high 32 bits not 0: %w", name, what, w, ErrBadParams)
	}
	return math.Float32frombits(uint32(w)), nil
}

// readF32s fills dst with the float32 values at va, through the Scratch's
// raw buffer 0. Errors are the MMU's, wrapped with the kernel and array
// names.
func readF32s(name string, mem Memory, sc *Scratch, dst []float32, what string, va uint64) error {
	buf := sc.raw.get(0, 4*len(dst))
	if err := mem.ReadAt(buf, va); err != nil {
		return fmt.Errorf("%s: read %s at %#x: %w", name, what, va, err)
	}
	decodeF32sInto(dst, buf)
	return nil
}

// writeF32s stores src as float32 values at va, through the Scratch's raw
// buffer 1.
func writeF32s(name string, mem Memory, sc *Scratch, src []float32, what string, va uint64) error {
	buf := sc.raw.get(1, 4*len(src))
	encodeF32sInto(buf, src)
	if err := mem.WriteAt(buf, va); err != nil {
		return fmt.Errorf("%s: write %s at %#x: %w", name, what, va, err)
	}
	return nil
}

// errNilMemory is returned, wrapped, by a kernel given no Memory.
func errNilMemory(name string) error { return fmt.Errorf("%s: nil Memory", name) }

// gridBlockRows returns how many rows of a grid with cols columns one
// block of a stencil kernel covers: about stencilBlockCells cells, at least
// one row.
func gridBlockRows(cols int) int { return max(1, stencilBlockCells/cols) }

// stencilBlockCells is the target cell count of one block of a grid kernel:
// the granularity of work sharing and of context checks (about 1 ms of one
// core).
const stencilBlockCells = 1 << 16
