//go:build amd64

#include "textflag.h"

// func repStosl(p *uint32, v uint32, n uint64)
// One string instruction: REP STOSL stores EAX into RCX words from RDI.
TEXT ·repStosl(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), DI
	MOVL v+8(FP), AX
	MOVQ n+16(FP), CX
	CLD
	REP; STOSL
	RET
