package devmodel

import (
	"fmt"

	"github.com/gpuvm/gpuvm/ipc"
)

// resetOverIPC asks the aggregator to reset the vGPU behind client (the
// device model's half of a function-level reset, docs/protocol.md §5.4)
// and returns once it is done.
func resetOverIPC(client *ipc.Client) error {
	r, err := client.Call(ipc.OpReset)
	if err != nil {
		return fmt.Errorf("vGPU reset: %w", err)
	}
	switch r.Status {
	case 0:
		return nil
	case -5:
		return fmt.Errorf("vGPU reset: a channel would not stop and the aggregator destroyed the vGPU (status %d)", r.Status)
	}
	return fmt.Errorf("vGPU reset refused by the aggregator (status %d)", r.Status)
}

// resetFunction is the guest's function-level reset, repeated on the
// restored vGPU when the connection ended with a saved Bye while it
// waited (the aggregator ran none of it).
func (d *Device) resetFunction() error {
	c := d.conn()
	for {
		err := resetOverIPC(c)
		if err == nil {
			return nil
		}
		var ok bool
		if c, ok = d.resumeAfter(c, err); !ok {
			return err
		}
	}
}

// ConfigRead is a guest read of size (1, 2 or 4) bytes at off of the
// vGPU's PCI configuration space, for the guest driver running in this
// process (nouveau.PCIConfig).
func (d *Device) ConfigRead(off, size int) (uint32, error) { return d.pci.Read(off, size) }

// ConfigWrite is a guest write of the vGPU's PCI configuration space. A
// write that initiates a function-level reset returns once the
// aggregator has reset the vGPU.
func (d *Device) ConfigWrite(off, size int, val uint32) error { return d.pci.Write(off, size, val) }
