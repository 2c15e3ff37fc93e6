package vgpuimage

import "fmt"

// Check applies the format's bounds to m, as Encode and Decode do: for an
// image put together in memory (its pages read from elsewhere).
func (m *Image) Check() error { return m.check() }

// check applies the format's bounds (docs/protocol.md §13.4) to m: what
// Encode refuses to write and Decode refuses to return. It says nothing
// about what the values mean on a board.
func (m *Image) check() error {
	if err := m.Identity.check(); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if err := checkRegs(m.Regs); err != nil {
		return fmt.Errorf("registers: %w", err)
	}
	if err := m.checkChans(); err != nil {
		return fmt.Errorf("channels: %w", err)
	}
	if (m.PV != nil) != m.Identity.PV {
		return fmt.Errorf("PV tables present %v for a vGPU with PV %v: %w", m.PV != nil, m.Identity.PV, ErrMalformed)
	}
	if m.PV != nil {
		if err := m.PV.check(&m.Identity); err != nil {
			return fmt.Errorf("PV: %w", err)
		}
	}
	if (m.PVDRM != nil) != m.Identity.PVDRM {
		return fmt.Errorf("pvdrm section present %v for a vGPU with pvdrm %v: %w", m.PVDRM != nil, m.Identity.PVDRM, ErrMalformed)
	}
	if m.PVDRM != nil {
		if err := m.PVDRM.check(&m.Identity); err != nil {
			return fmt.Errorf("pvdrm: %w", err)
		}
	}
	if len(m.Account.Waits) > MaxWaitBuckets {
		return fmt.Errorf("account: %d wait buckets, at most %d: %w", len(m.Account.Waits), MaxWaitBuckets, ErrMalformed)
	}
	var end uint64
	for i, p := range m.Pages {
		if err := checkPage(p.Off, uint64(len(p.Data)), end, m.Identity.VRAM); err != nil {
			return fmt.Errorf("VRAM page %d: %w", i, err)
		}
		end = p.Off + uint64(len(p.Data))
	}
	return nil
}

func (id *Identity) check() error {
	switch {
	case !validMode(id.Mode):
		return fmt.Errorf("mode %q: want 1..%d bytes of [a-z0-9._-]: %w", id.Mode, MaxModeLen, ErrMalformed)
	case id.Profile != "" && !validProfile(id.Profile):
		return fmt.Errorf("profile %q: not a profile name: %w", id.Profile, ErrMalformed)
	case !validName(id.Name):
		return fmt.Errorf("name %q: want 1..%d printable ASCII bytes without '/': %w", id.Name, MaxNameLen, ErrMalformed)
	case id.RAM < MinRAM || id.RAM > MaxRAM:
		return fmt.Errorf("RAM %d bytes: want %d..%d: %w", id.RAM, MinRAM, uint64(MaxRAM), ErrMalformed)
	case id.VRAM == 0 || id.VRAM > MaxVRAM || id.VRAM%VRAMGranule != 0:
		return fmt.Errorf("VRAM %d bytes: want a multiple of %d up to %d: %w", id.VRAM, VRAMGranule, uint64(MaxVRAM), ErrMalformed)
	case id.Channels == 0 || id.Channels > MaxChannels:
		return fmt.Errorf("%d channels: want 1..%d: %w", id.Channels, MaxChannels, ErrMalformed)
	case id.BAR1 == 0 || id.BAR1 > MaxBAR1 || id.BAR1%PageSize != 0:
		return fmt.Errorf("BAR1 slice %d bytes: want a multiple of %d up to %d: %w", id.BAR1, PageSize, MaxBAR1, ErrMalformed)
	case id.BAR3 == 0 || id.BAR3 > MaxBAR3 || id.BAR3%PageSize != 0:
		return fmt.Errorf("BAR3 slice %d bytes: want a multiple of %d up to %d: %w", id.BAR3, PageSize, MaxBAR3, ErrMalformed)
	}
	return nil
}

func validMode(s string) bool {
	return len(s) > 0 && len(s) <= MaxModeLen && validChars(s)
}

// validChars reports whether s is all [a-z0-9._-].
func validChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func validProfile(s string) bool {
	if len(s) == 0 || len(s) > MaxProfileLen || s[0] == '.' || s[0] == '_' || s[0] == '-' {
		return false
	}
	return validChars(s)
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7E || c == '/' {
			return false
		}
	}
	return true
}

func checkRegs(regs []Reg) error {
	if len(regs) > MaxRegs {
		return fmt.Errorf("%d registers, at most %d: %w", len(regs), MaxRegs, ErrMalformed)
	}
	for i, r := range regs {
		if r.Off%4 != 0 || r.Off >= BAR0Size {
			return fmt.Errorf("register %#x: not a BAR0 word: %w", r.Off, ErrMalformed)
		}
		if i > 0 && r.Off <= regs[i-1].Off {
			return fmt.Errorf("register %#x after %#x: offsets must increase: %w", r.Off, regs[i-1].Off, ErrMalformed)
		}
	}
	return nil
}

func (m *Image) checkChans() error {
	if uint64(len(m.Chans)) != uint64(m.Identity.Channels) {
		return fmt.Errorf("%d channels for a vGPU of %d: %w", len(m.Chans), m.Identity.Channels, ErrMalformed)
	}
	for i, c := range m.Chans {
		if c.State != nil && (len(c.State) == 0 || len(c.State) > MaxStateWords) {
			return fmt.Errorf("channel %d: %d state words, want 1..%d: %w", i, len(c.State), MaxStateWords, ErrMalformed)
		}
	}
	return nil
}

func (p *PV) check(id *Identity) error {
	if len(p.Objects) > MaxPVObjects {
		return fmt.Errorf("%d objects, at most %d: %w", len(p.Objects), MaxPVObjects, ErrMalformed)
	}
	dirs := map[uint32]bool{}
	for i, o := range p.Objects {
		if o.Handle == 0 || (i > 0 && o.Handle <= p.Objects[i-1].Handle) || o.Handle > p.Next {
			return fmt.Errorf("object %d: handle %d: handles must increase, from 1 up to next (%d): %w", i, o.Handle, p.Next, ErrMalformed)
		}
		want := 0
		switch o.Kind {
		case KindPageDir:
			dirs[o.Handle] = true
			if o.In != 0 || o.PDE != 0 {
				return fmt.Errorf("directory %d linked into %d: %w", o.Handle, o.In, ErrMalformed)
			}
		case KindSmallTable:
			want = SmallTableLen
		case KindLargeTable:
			want = LargeTableLen
		default:
			return fmt.Errorf("object %d: kind %d: %w", o.Handle, o.Kind, ErrMalformed)
		}
		if len(o.Entries) != want {
			return fmt.Errorf("object %d: %d entries, want %d: %w", o.Handle, len(o.Entries), want, ErrMalformed)
		}
		if o.PDE >= maxPDE {
			return fmt.Errorf("object %d: directory entry %d, at most %d: %w", o.Handle, o.PDE, maxPDE-1, ErrMalformed)
		}
	}
	for _, o := range p.Objects {
		if o.In != 0 && !dirs[o.In] {
			return fmt.Errorf("table %d linked into %d, which is no directory of the image: %w", o.Handle, o.In, ErrMalformed)
		}
	}
	if len(p.Bindings) > MaxPVBindings {
		return fmt.Errorf("%d bindings, at most %d: %w", len(p.Bindings), MaxPVBindings, ErrMalformed)
	}
	for i, b := range p.Bindings {
		if i > 0 && b.RAMIN <= p.Bindings[i-1].RAMIN {
			return fmt.Errorf("binding %d: instance blocks must increase: %w", i, ErrMalformed)
		}
		if !dirs[b.PD] {
			return fmt.Errorf("binding of %#x to %d, which is no directory of the image: %w", b.RAMIN, b.PD, ErrMalformed)
		}
	}
	if uint64(len(p.BAR1)) != id.BAR1/PageSize || uint64(len(p.BAR3)) != id.BAR3/PageSize {
		return fmt.Errorf("apertures of %d and %d pages for slices of %d and %d: %w",
			len(p.BAR1), len(p.BAR3), id.BAR1/PageSize, id.BAR3/PageSize, ErrMalformed)
	}
	if len(p.HC.Slots) > MaxHCSlots {
		return fmt.Errorf("%d hypercall slots, at most %d: %w", len(p.HC.Slots), MaxHCSlots, ErrMalformed)
	}
	for i, s := range p.HC.Slots {
		if s.Index >= MaxHCSlots || (i > 0 && s.Index <= p.HC.Slots[i-1].Index) {
			return fmt.Errorf("hypercall slot %d: indexes must increase, below %d: %w", s.Index, MaxHCSlots, ErrMalformed)
		}
		if s.GPA%PageSize != 0 || s.GPA >= id.RAM || id.RAM-s.GPA < PageSize {
			return fmt.Errorf("hypercall slot %d: page %#x outside %d bytes of RAM: %w", s.Index, s.GPA, id.RAM, ErrMalformed)
		}
	}
	return nil
}

// checkPage checks a VRAM page of n bytes at off after the previous one,
// which ended at end, in a slot of vram bytes.
func checkPage(off, n, end, vram uint64) error {
	switch {
	case n == 0 || n > MaxPageSection || n%PageSize != 0:
		return fmt.Errorf("%d bytes: want a multiple of %d up to %d: %w", n, PageSize, MaxPageSection, ErrMalformed)
	case off%PageSize != 0:
		return fmt.Errorf("offset %#x: not page-aligned: %w", off, ErrMalformed)
	case off < end:
		return fmt.Errorf("offset %#x before the end of the previous page (%#x): pages must be sorted and not overlap: %w", off, end, ErrMalformed)
	case off >= vram || vram-off < n:
		return fmt.Errorf("[%#x, +%#x) past the image's VRAM of %#x: %w", off, n, vram, ErrMalformed)
	}
	return nil
}
