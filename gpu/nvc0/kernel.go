package nvc0

import "math"

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

// The Rodinia-like kernels of the GPUvm evaluation (thesis Table 4.2: bp, hs,
// lud, nn, srad, srad2). Arrays are little-endian float32, row-major.
// Dimensions and counts are plain words; a float32 scalar travels as its IEEE
// 754 bit pattern in the low 32 bits of a word whose high 32 bits are 0
// ([F32Word]). Package gpu/kernels defines each kernel's arithmetic, its
// evaluation order and its cost.
const (
	// KernelBPForward is back propagation's layer-forward step
	// (bpnn_layerforward): params [x, w, partial, nin, nh]. x holds nin
	// inputs, w the (nin+1)×nh input→hidden weights (row 0 the bias weights,
	// row i+1 those of input i). For each block b of BPBlockInputs
	// consecutive inputs (the last block may be shorter) and each hidden unit
	// j it stores the block's partial sum Σ x[i]·w[i+1][j] at partial[b·nh+j]
	// (⌈nin/BPBlockInputs⌉×nh values); the host adds the blocks up.
	KernelBPForward KernelID = 7
	// KernelBPAdjust is back propagation's weight adjustment
	// (bpnn_adjust_weights): params [delta, x, w, oldw, nin, nh]. delta holds
	// nh hidden-unit error terms, x nin inputs, w and oldw the (nin+1)×nh
	// weights and previous weight changes, both updated in place.
	KernelBPAdjust KernelID = 8
	// KernelHotspot runs steps iterations of the hotspot thermal stencil:
	// params [power, src, dst, rows, cols, steps, stepDivCap, rx1, ry1, rz1,
	// amb]. power, src and dst are rows×cols grids; the temperatures after
	// steps iterations from src are stored in dst (one launch computes a
	// "pyramid" of steps iterations). The last five words are float32
	// scalars: the time step over the heat capacity, the inverse thermal
	// resistances in x, y and z, and the ambient temperature.
	KernelHotspot KernelID = 9
	// KernelLUDDiagonal factors the diagonal block at offset k of the n×n
	// matrix a in place (lud_diagonal): params [a, n, k]. k is a multiple of
	// LUDBlockSize below n; the block is min(LUDBlockSize, n-k) wide.
	KernelLUDDiagonal KernelID = 10
	// KernelLUDPerimeter solves the block row right of, and the block column
	// below, the factored diagonal block at offset k (lud_perimeter): params
	// [a, n, k].
	KernelLUDPerimeter KernelID = 11
	// KernelLUDInternal updates the trailing submatrix below and right of the
	// block row and column at offset k (lud_internal): params [a, n, k].
	KernelLUDInternal KernelID = 12
	// KernelNN computes the Euclidean distance of n records to a target
	// (nearest neighbour's euclid): params [locs, dist, n, lat, lng]. locs
	// holds n (latitude, longitude) float32 pairs, dist receives n float32
	// distances; lat and lng are float32 scalars.
	KernelNN KernelID = 13
	// KernelSradExtract maps n pixels in place to exp(pixel/255) (srad_v1's
	// extract): params [img, n].
	KernelSradExtract KernelID = 14
	// KernelSradReduce stores the sum of n pixels and the sum of their
	// squares as two float32 values at sums (srad_v1's prepare and reduce):
	// params [img, sums, n].
	KernelSradReduce KernelID = 15
	// KernelSradCoeff is SRAD's first kernel (srad_v1's srad, srad_v2's
	// srad_cuda_1): params [j, dn, ds, dw, de, c, rows, cols, q0sqr]. From the
	// rows×cols image j it stores the differences to the four neighbours in
	// dn, ds, dw, de and the diffusion coefficient in c; q0sqr, a float32
	// scalar, is the speckle scale.
	KernelSradCoeff KernelID = 16
	// KernelSradUpdate is SRAD's second kernel (srad_v1's srad2, srad_v2's
	// srad_cuda_2): params [j, dn, ds, dw, de, c, rows, cols, lambda]: the
	// divergence of the diffusion updates j in place; lambda is a float32
	// scalar.
	KernelSradUpdate KernelID = 17
	// KernelSradCompress maps n pixels in place to log(pixel)·255 (srad_v1's
	// compress): params [img, n].
	KernelSradCompress KernelID = 18
)

// F32Word returns the parameter word that carries the float32 f: its bit
// pattern in the low 32 bits.
func F32Word(f float32) uint64 { return uint64(math.Float32bits(f)) }

// Bounds and block sizes of the Rodinia-like kernels.
const (
	// MaxKernelGridDim bounds rows and cols of the hotspot and SRAD grids
	// (a 4096×4096 float32 grid is 64 MiB).
	MaxKernelGridDim = 4096
	// MaxKernelPixels bounds n of srad_extract, srad_reduce and
	// srad_compress (4096² pixels).
	MaxKernelPixels = MaxKernelGridDim * MaxKernelGridDim
	// MaxKernelStencilSteps bounds the iterations of one hotspot launch.
	MaxKernelStencilSteps = 1024
	// BPBlockInputs is how many inputs one partial sum of bp_layerforward
	// covers (Rodinia's 16×16 thread block).
	BPBlockInputs = 16
	// MaxKernelBPInputs bounds nin of the back-propagation kernels.
	MaxKernelBPInputs = 1 << 22
	// MaxKernelBPHidden bounds nh of the back-propagation kernels.
	MaxKernelBPHidden = 64
	// MaxKernelBPWeights bounds (nin+1)·nh, the size of a weight matrix
	// (64 MiB of float32).
	MaxKernelBPWeights = 1 << 24
	// LUDBlockSize is the block edge of the LU decomposition kernels
	// (Rodinia's BLOCK_SIZE).
	LUDBlockSize = 16
	// MaxKernelNNRecords bounds n of the nearest-neighbour kernel.
	MaxKernelNNRecords = 1 << 22
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
	case KernelBPForward:
		return "bp_layerforward"
	case KernelBPAdjust:
		return "bp_adjust_weights"
	case KernelHotspot:
		return "hotspot"
	case KernelLUDDiagonal:
		return "lud_diagonal"
	case KernelLUDPerimeter:
		return "lud_perimeter"
	case KernelLUDInternal:
		return "lud_internal"
	case KernelNN:
		return "nn_euclid"
	case KernelSradExtract:
		return "srad_extract"
	case KernelSradReduce:
		return "srad_reduce"
	case KernelSradCoeff:
		return "srad_coeff"
	case KernelSradUpdate:
		return "srad_update"
	case KernelSradCompress:
		return "srad_compress"
	}
	return "unknown"
}
