package ioreq

import (
	"testing"
	"unsafe"

	"github.com/gpuvm/gpuvm/internal/cprobe"
	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// TestABI checks Raw, the bitfields, the page and every constant against
// Xen's hvm/ioreq.h (libxen-dev), compiled by gcc. The bitfields have no
// offsetof: the probe sets each one alone to all ones and prints the byte
// that holds it.
func TestABI(t *testing.T) {
	c := cprobe.Run(t, "libxen-dev", []string{"xen/hvm/ioreq.h", "xen/hvm/hvm_info_table.h"}, "#include <string.h>\n", `
	SZ(ioreq);
	FIELD(ioreq, addr); FIELD(ioreq, data); FIELD(ioreq, count); FIELD(ioreq, size);
	FIELD(ioreq, vp_eport); FIELD(ioreq, _pad0); FIELD(ioreq, type);
	P("sizeof ioreq_t", sizeof(ioreq_t));
	{
		struct ioreq r;
		unsigned char *b = (unsigned char *)&r;
		memset(&r, 0, sizeof r); r.state = 0xf; P("bits byte", (long long)(&b[30] - b)); P("state mask", b[30]);
		memset(&r, 0, sizeof r); r.data_is_ptr = 1; P("data_is_ptr mask", b[30]);
		memset(&r, 0, sizeof r); r.dir = 1; P("dir mask", b[30]);
		memset(&r, 0, sizeof r); r.df = 1; P("df mask", b[30]);
		memset(&r, 0, sizeof r); r.state = 0xf; r.data_is_ptr = 1; r.dir = 1; r.df = 1;
		P("bitfields outside byte 30", (long long)(b[28] | b[29] | b[31]));
	}
	P("offsetof shared_iopage.vcpu_ioreq[1]", offsetof(struct shared_iopage, vcpu_ioreq[1]));
	P("HVM_MAX_VCPUS", HVM_MAX_VCPUS);
	P("STATE_IOREQ_NONE", STATE_IOREQ_NONE); P("STATE_IOREQ_READY", STATE_IOREQ_READY);
	P("STATE_IOREQ_INPROCESS", STATE_IOREQ_INPROCESS); P("STATE_IORESP_READY", STATE_IORESP_READY);
	P("IOREQ_TYPE_PIO", IOREQ_TYPE_PIO); P("IOREQ_TYPE_COPY", IOREQ_TYPE_COPY);
	P("IOREQ_TYPE_PCI_CONFIG", IOREQ_TYPE_PCI_CONFIG); P("IOREQ_TYPE_INVALIDATE", IOREQ_TYPE_INVALIDATE);
	P("IOREQ_READ", IOREQ_READ); P("IOREQ_WRITE", IOREQ_WRITE);`)

	g := cprobe.Layout{}
	var r Raw
	g.Size("ioreq", unsafe.Sizeof(r))
	g.Field("ioreq", "addr", unsafe.Sizeof(r.Addr), unsafe.Offsetof(r.Addr))
	g.Field("ioreq", "data", unsafe.Sizeof(r.Data), unsafe.Offsetof(r.Data))
	g.Field("ioreq", "count", unsafe.Sizeof(r.Count), unsafe.Offsetof(r.Count))
	g.Field("ioreq", "size", unsafe.Sizeof(r.Size), unsafe.Offsetof(r.Size))
	g.Field("ioreq", "vp_eport", unsafe.Sizeof(r.VPEport), unsafe.Offsetof(r.VPEport))
	g.Field("ioreq", "_pad0", unsafe.Sizeof(r.Pad0), unsafe.Offsetof(r.Pad0))
	g.Field("ioreq", "type", unsafe.Sizeof(r.Type), unsafe.Offsetof(r.Type))
	g["sizeof ioreq_t"] = SlotSize
	g["bits byte"] = int64(unsafe.Offsetof(r.Bits))
	g["state mask"] = bitsStateMask
	g["data_is_ptr mask"] = bitsDataIsPtr
	g["dir mask"] = bitsDir
	g["df mask"] = bitsDF
	g["bitfields outside byte 30"] = 0
	g["offsetof shared_iopage.vcpu_ioreq[1]"] = SlotSize
	g["HVM_MAX_VCPUS"] = MaxVCPUs
	g["STATE_IOREQ_NONE"] = StateNone
	g["STATE_IOREQ_READY"] = StateReady
	g["STATE_IOREQ_INPROCESS"] = StateInProcess
	g["STATE_IORESP_READY"] = StateRespReady
	g["IOREQ_TYPE_PIO"] = int64(KindPIO)
	g["IOREQ_TYPE_COPY"] = int64(KindMMIO)
	g["IOREQ_TYPE_PCI_CONFIG"] = int64(KindPCIConfig)
	g["IOREQ_TYPE_INVALIDATE"] = typeInvalidate
	g["IOREQ_READ"] = dirRead
	g["IOREQ_WRITE"] = dirWrite
	cprobe.Compare(t, c, g)

	if stateWordOffset != unsafe.Offsetof(r.Pad0) || bitsOffsetInSlot != unsafe.Offsetof(r.Bits) {
		t.Fatalf("the state word is not _pad0, the bitfields and type")
	}
	if MaxVCPUs != privcmd.MaxVCPUs {
		t.Fatalf("ioreq.MaxVCPUs %d, privcmd.MaxVCPUs %d", MaxVCPUs, privcmd.MaxVCPUs)
	}
}
