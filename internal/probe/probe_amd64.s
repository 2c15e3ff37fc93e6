// The probe points (see probe.go): a 5-byte NOP for the uprobe, then RET.

#include "textflag.h"

#define PROBE_NOP BYTE $0x0f; BYTE $0x1f; BYTE $0x44; BYTE $0x00; BYTE $0x00

// func TrapBegin(vgpu, bar int, write bool)
TEXT ·TrapBegin(SB), NOSPLIT|NOFRAME, $0-17
	PROBE_NOP
	RET

// func TrapEnd(vgpu int)
TEXT ·TrapEnd(SB), NOSPLIT|NOFRAME, $0-8
	PROBE_NOP
	RET

// func Release(vgpu int, waitNs int64)
TEXT ·Release(SB), NOSPLIT|NOFRAME, $0-16
	PROBE_NOP
	RET
