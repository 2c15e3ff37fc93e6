package ioreq

import (
	"fmt"
	"slices"

	"github.com/gpuvm/gpuvm/xen/privcmd"
)

// Claim is a range a server serves: ports or guest-physical memory, or
// one PCI function's config space.
type Claim struct {
	Kind Kind
	// Base is the first port or address, or for KindPCIConfig the
	// function's SBDF.
	Base uint64
	// Size is the number of ports or bytes (1 for KindPCIConfig).
	Size uint64
}

// MMIO claims size bytes of guest-physical memory at base.
func MMIO(base, size uint64) Claim { return Claim{Kind: KindMMIO, Base: base, Size: size} }

// Ports claims n I/O ports from base.
func Ports(base, n uint64) Claim { return Claim{Kind: KindPIO, Base: base, Size: n} }

// PCIDevice claims the config space of PCI function sbdf.
func PCIDevice(sbdf privcmd.SBDF) Claim {
	return Claim{Kind: KindPCIConfig, Base: uint64(sbdf), Size: 1}
}

// String describes the claim.
func (c Claim) String() string {
	if c.Kind == KindPCIConfig {
		return fmt.Sprintf("pci %v", privcmd.SBDF(c.Base))
	}
	return fmt.Sprintf("%v [%#x, +%#x)", c.Kind, c.Base, c.Size)
}

// xenRange returns the dm_op range type and inclusive bounds of c.
func (c Claim) xenRange() (privcmd.RangeType, uint64, uint64) {
	t := privcmd.RangeMemory
	switch c.Kind {
	case KindPIO:
		t = privcmd.RangePort
	case KindPCIConfig:
		t = privcmd.RangePCI
	}
	return t, c.Base, c.Base + c.Size - 1
}

// check refuses an empty, wrapping or unknown claim.
func (c Claim) check() error {
	switch {
	case c.Kind != KindPIO && c.Kind != KindMMIO && c.Kind != KindPCIConfig:
		return fmt.Errorf("ioreq claim: %v cannot be claimed", c.Kind)
	case c.Size == 0:
		return fmt.Errorf("ioreq claim %v: empty", c)
	case c.Base+c.Size-1 < c.Base:
		return fmt.Errorf("ioreq claim %v: wraps", c)
	case c.Kind == KindPCIConfig && c.Size != 1:
		return fmt.Errorf("ioreq claim %v: one PCI function per claim", c)
	}
	t, start, end := c.xenRange()
	if err := privcmd.CheckIORange(t, start, end); err != nil {
		return fmt.Errorf("ioreq claim: %w", err)
	}
	return nil
}

// overlaps reports whether c and d share an address.
func (c Claim) overlaps(d Claim) bool {
	return c.Kind == d.Kind && c.Base <= d.Base+d.Size-1 && d.Base <= c.Base+c.Size-1
}

// covers reports whether the claim holds all of request r.
func (c Claim) covers(r Request) bool {
	if c.Kind != r.Kind {
		return false
	}
	if r.Kind == KindPCIConfig {
		return privcmd.SBDF(c.Base) == r.Device
	}
	lo, n := r.Span()
	return n <= c.Size && lo >= c.Base && lo-c.Base <= c.Size-n
}

// Claim has the server serve c too (on Xen, the range is claimed from
// the hypervisor first). It refuses a claim that overlaps one it holds.
func (s *Server) Claim(c Claim) error {
	if err := c.check(); err != nil {
		return err
	}
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.isClosed() {
		return fmt.Errorf("ioreq claim %v: %w", c, ErrClosed)
	}
	cur := *s.claims.Load()
	if len(cur) >= MaxClaims {
		return fmt.Errorf("ioreq claim %v: the server holds %d claims already", c, MaxClaims)
	}
	for _, d := range cur {
		if c.overlaps(d) {
			return fmt.Errorf("ioreq claim %v: overlaps %v", c, d)
		}
	}
	if s.ctl != nil {
		if err := s.ctl.claim(c); err != nil {
			return fmt.Errorf("ioreq claim %v: %w", c, err)
		}
	}
	next := append(slices.Clone(cur), c)
	s.claims.Store(&next)
	return nil
}

// Release stops serving c, a claim the server holds exactly (on Xen, the
// range goes back to the hypervisor first). A request already posted for
// it is still answered, as refused.
func (s *Server) Release(c Claim) error {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.isClosed() {
		return fmt.Errorf("ioreq release %v: %w", c, ErrClosed)
	}
	cur := *s.claims.Load()
	i := slices.Index(cur, c)
	if i < 0 {
		return fmt.Errorf("ioreq release %v: not claimed", c)
	}
	if s.ctl != nil {
		if err := s.ctl.release(c); err != nil {
			return fmt.Errorf("ioreq release %v: %w", c, err)
		}
	}
	next := slices.Delete(slices.Clone(cur), i, i+1)
	s.claims.Store(&next)
	return nil
}

// claimed checks a decoded request lies within a claim.
func (s *Server) claimed(r Request) error {
	for _, c := range *s.claims.Load() {
		if c.covers(r) {
			return nil
		}
	}
	return fmt.Errorf("%w: %v outside the server's claims", ErrMalformed, r)
}
