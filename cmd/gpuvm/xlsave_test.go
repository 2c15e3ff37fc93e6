package main

import (
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/devmodel"
)

// TestXLSaveRecordCheck: gpuvm xl restore reads FILE.gpuvm from disk, so
// a record is checked before anything is created from it: a newer
// version, an unknown mode, a RAM span no domain has, a domain type
// without a device model, a PCI address that is not one, a pvdrm record
// that names a device model's parts — each refused with the reason.
func TestXLSaveRecordCheck(t *testing.T) {
	good := xlSaveRecord{Version: xlRecordVersion, Name: "gpu-fv", Type: "pvh", Mode: "fv-optimized", RAMSpan: 272 << 20, PCI: "0000:00:05.0",
		Placements: []devmodel.BARPlacement{{Index: 0, Base: 0xe0000000, Size: 32 << 20, Enabled: true}}}
	if err := good.check(); err != nil {
		t.Fatalf("a good record: %v", err)
	}
	for _, c := range []struct {
		edit func(*xlSaveRecord)
		want string
	}{
		{func(r *xlSaveRecord) { r.Version = 2 }, "record version 2"},
		{func(r *xlSaveRecord) { r.Name = "" }, "no domain name"},
		{func(r *xlSaveRecord) { r.Mode = "pvdrm" }, "a pvdrm domain's record names a device model's"},
		{func(r *xlSaveRecord) { r.Mode, r.RAMSpan, r.PCI, r.Placements = "pvdrm", 0, "", nil; r.Type = "xen" }, `domain type "xen"`},
		{func(r *xlSaveRecord) { r.Mode = "turbo" }, `mode "turbo"`},
		{func(r *xlSaveRecord) { r.RAMSpan = 0 }, "RAM span 0"},
		{func(r *xlSaveRecord) { r.RAMSpan = 1 << 50 }, "RAM span"},
		{func(r *xlSaveRecord) { r.Type = "pv" }, `domain type "pv"`},
		{func(r *xlSaveRecord) { r.PCI = "00:05" }, `pci "00:05"`},
	} {
		r := good
		c.edit(&r)
		if err := r.check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("record %+v: %v, want %q", r, err, c.want)
		}
	}
	pv := xlSaveRecord{Version: xlRecordVersion, Name: "gpu-pvdrm", Type: "pv", Mode: "pvdrm-pooling"}
	if err := pv.check(); err != nil {
		t.Errorf("a pvdrm domain's record: %v", err)
	}
}
