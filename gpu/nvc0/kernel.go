package nvc0

// sim: the built-in kernel ABI. A kernel's code object, placed in GPU memory at
// CODE_ADDRESS + CP_START_ID, is a small header that names a kernel of the
// board's built-in library. Its parameters are little-endian u64 words in the
// constant buffer (CB_ADDRESS, CB_SIZE). Pointers are GPU virtual addresses.
const (
	KernelMagic      = 0x4B565047 // "GPVK" little-endian
	KernelObjectSize = 16         // magic u32, kernel id u32, version u32, reserved u32
	KernelVersion    = 1
)

// KernelID names a built-in kernel.
type KernelID uint32

// The built-in kernels and their parameter lists.
const (
	KernelNop KernelID = 1 // no parameters
	// KernelLoop spins: params [iterations, result]. It advances a 64-bit
	// linear congruential generator iterations times and, when result is not
	// 0, stores the final value (u64) there, so a run can be verified.
	KernelLoop KernelID = 2
	// KernelMadd: params [a, b, c, n]: c = a + b over n×n uint32 matrices (wrapping).
	KernelMadd KernelID = 3
	// KernelMmul: params [a, b, c, n]: c = a × b over n×n uint32 matrices (wrapping).
	KernelMmul KernelID = 4
	// KernelFmadd: params [a, b, c, n]: c = a + b over n×n float32 matrices.
	KernelFmadd KernelID = 5
	// KernelFmmul: params [a, b, c, n]: c = a × b over n×n float32 matrices.
	KernelFmmul KernelID = 6
)

// MaxKernelMatrixDim bounds n for the matrix kernels (a 4096×4096 matrix is 64 MiB).
const MaxKernelMatrixDim = 4096

// MaxKernelLoopIterations bounds the loop kernel's iteration count.
const MaxKernelLoopIterations = 1 << 40

// String names the kernel.
func (k KernelID) String() string {
	switch k {
	case KernelNop:
		return "nop"
	case KernelLoop:
		return "loop"
	case KernelMadd:
		return "madd"
	case KernelMmul:
		return "mmul"
	case KernelFmadd:
		return "fmadd"
	case KernelFmmul:
		return "fmmul"
	}
	return "unknown"
}
