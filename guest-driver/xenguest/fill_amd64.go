//go:build amd64

package xenguest

// repStosl stores v into the n words from p with one REP STOSL (string
// store, fill_amd64.s): Xen's instruction emulator hands a repeated store
// to emulated MMIO to the device model as one ioreq with a count (up to
// 4096 repetitions per ioreq), where n MOVs would be n traps.
func repStosl(p *uint32, v uint32, n uint64)

// fillWords stores v into n consecutive words from p with one instruction.
func fillWords(p *uint32, v uint32, n uint64) { repStosl(p, v, n) }

// fillIsOneInstruction says whether fillWords is one string instruction
// (it is on amd64) or a loop of stores.
const fillIsOneInstruction = true
