//go:build linux && amd64

#include "textflag.h"

// func inl(port uint16) uint32
// One IN: a 32-bit read of the I/O port in DX into EAX.
TEXT ·inl(SB), NOSPLIT, $0-12
	MOVW port+0(FP), DX
	INL
	MOVL AX, ret+8(FP)
	RET

// func outl(port uint16, v uint32)
// One OUT: a 32-bit write of EAX to the I/O port in DX.
TEXT ·outl(SB), NOSPLIT, $0-8
	MOVW port+0(FP), DX
	MOVL v+4(FP), AX
	OUTL
	RET
