//go:build !amd64

package xenguest

// There is no string store here: memWindow.fill32 declines, and a fill is
// made of single stores (Write32), each its own trap.
const fillIsOneInstruction = false

func fillWords(p *uint32, v uint32, n uint64) {
	panic("xenguest: fillWords without a string store instruction")
}
