package hypercall

import (
	"encoding/binary"
	"errors"
)

// Call is one decoded call. Only the fields of its Op's Spec are set.
type Call struct {
	Op     Op
	Kind   uint32 // OpMemAlloc
	Handle uint32 // OpMemFree
	RAMIN  uint64 // OpSetPGD
	PD     uint32 // OpSetPGD, OpMapPGT, OpVMFlush
	PDE    uint32 // OpMapPGT
	Small  uint32 // OpMapPGT
	Large  uint32 // OpMapPGT
	PT     uint32 // map ops
	BAR    uint32 // BAR ops
	Index  uint32 // first entry (map ops) or first aperture page (BAR ops)
	Count  uint32
	PTE    uint64   // OpMap, OpMapBatch, OpBARMap
	PTEs   []uint64 // OpMapSGBatch
	// Channel is the guest's channel id (OpYieldPoints).
	Channel uint32
	// Points are GPFIFO entry indices (OpYieldPoints).
	Points []uint32
	// At is the byte offset of the call's header in the slot page, where
	// its result goes.
	At int
}

// Decoder decodes slot pages. It holds the ABI table; it is immutable and
// safe for concurrent use.
type Decoder struct {
	specs map[Op]Spec
}

// NewDecoder returns a Decoder for Specs().
func NewDecoder() *Decoder {
	d := &Decoder{specs: map[Op]Spec{}}
	for _, s := range Specs() {
		d.specs[s.Op] = s
	}
	return d
}

// Decode decodes the call in page, a private copy of a slot page (the
// caller copies the guest's page once; nothing here reads guest memory).
// A multicall yields its calls in order, each with At set; a call that
// fails to decode inside a multicall is returned with a failed code in
// codes (same index) and the rest still decode. The top-level Code is not
// OK when the page itself is malformed; then nothing runs.
func (d *Decoder) Decode(page []byte) (calls []Call, codes []Code, top Code) {
	if len(page) != PageSize {
		return nil, nil, ErrInval
	}
	op := Op(le32(page, OffOp))
	n := le32(page, OffLen)
	if n > MaxArgs {
		return nil, nil, ErrRange
	}
	args := page[HeaderSize : HeaderSize+int(n)]
	if op != OpMulticall {
		c, code := d.decodeOne(op, args)
		c.At = 0
		if code != OK {
			return nil, nil, code
		}
		return []Call{c}, []Code{OK}, OK
	}
	at := HeaderSize
	end := HeaderSize + int(n)
	for at < end {
		if len(calls) == MaxMulticall {
			return nil, nil, ErrRange
		}
		if end-at < HeaderSize {
			return nil, nil, ErrInval
		}
		sub := Op(le32(page, at+OffOp))
		sn := le32(page, at+OffLen)
		if sn > uint32(end-at-HeaderSize) {
			return nil, nil, ErrInval
		}
		var c Call
		code := ErrNoSys
		if sub != OpMulticall {
			c, code = d.decodeOne(sub, page[at+HeaderSize:at+HeaderSize+int(sn)])
		}
		c.Op, c.At = sub, at
		calls = append(calls, c)
		codes = append(codes, code)
		at += HeaderSize + pad8(int(sn))
	}
	if len(calls) == 0 {
		return nil, nil, ErrInval
	}
	return calls, codes, OK
}

func pad8(n int) int { return (n + 7) &^ 7 }

// decodeOne decodes one call's arguments by its Spec.
func (d *Decoder) decodeOne(op Op, args []byte) (Call, Code) {
	s, ok := d.specs[op]
	if !ok || op == OpMulticall {
		return Call{Op: op}, ErrNoSys
	}
	c := Call{Op: op}
	if len(args) < s.Fixed {
		return c, ErrInval
	}
	for _, f := range s.Fields {
		var v uint64
		if f.Size == 8 {
			v = binary.LittleEndian.Uint64(args[f.Off:])
		} else {
			v = uint64(le32(args, f.Off))
		}
		if !c.set(f.Name, v) {
			return c, ErrInval // a reserved field is not 0
		}
	}
	rest := len(args) - s.Fixed
	switch {
	case s.Elem == 0 && rest != 0:
		return c, ErrInval
	case s.Elem > 0:
		if c.Count > uint32(s.MaxElems) {
			return c, ErrRange
		}
		if rest != int(c.Count)*s.Elem {
			return c, ErrInval
		}
		if s.Elem == 4 {
			c.Points = make([]uint32, c.Count)
			for i := range c.Points {
				c.Points[i] = le32(args, s.Fixed+i*s.Elem)
			}
			break
		}
		c.PTEs = make([]uint64, c.Count)
		for i := range c.PTEs {
			c.PTEs[i] = binary.LittleEndian.Uint64(args[s.Fixed+i*s.Elem:])
		}
	}
	return c, OK
}

// set stores a decoded field; it reports false for a reserved field that
// is not zero.
func (c *Call) set(name string, v uint64) bool {
	switch name {
	case "kind":
		c.Kind = uint32(v)
	case "handle":
		c.Handle = uint32(v)
	case "ramin":
		c.RAMIN = v
	case "pd":
		c.PD = uint32(v)
	case "pde":
		c.PDE = uint32(v)
	case "small":
		c.Small = uint32(v)
	case "large":
		c.Large = uint32(v)
	case "pt":
		c.PT = uint32(v)
	case "bar":
		c.BAR = uint32(v)
	case "index", "page":
		c.Index = uint32(v)
	case "count":
		c.Count = uint32(v)
	case "pte":
		c.PTE = v
	case "channel":
		c.Channel = uint32(v)
	case "reserved":
		return v == 0
	}
	return true
}

// get returns a field's value for encoding.
func (c *Call) get(name string) uint64 {
	switch name {
	case "kind":
		return uint64(c.Kind)
	case "handle":
		return uint64(c.Handle)
	case "ramin":
		return c.RAMIN
	case "pd":
		return uint64(c.PD)
	case "pde":
		return uint64(c.PDE)
	case "small":
		return uint64(c.Small)
	case "large":
		return uint64(c.Large)
	case "pt":
		return uint64(c.PT)
	case "bar":
		return uint64(c.BAR)
	case "index", "page":
		return uint64(c.Index)
	case "count":
		return uint64(c.Count)
	case "pte":
		return c.PTE
	case "channel":
		return uint64(c.Channel)
	}
	return 0
}

// PutResult writes a call's result into a slot page at the call's header.
func PutResult(page []byte, at int, code Code, value uint32) {
	binary.LittleEndian.PutUint32(page[at+OffResult:], uint32(code))
	binary.LittleEndian.PutUint32(page[at+OffValue:], value)
}

// Result reads a call's result and value from a slot page.
func Result(page []byte, at int) (Code, uint32) {
	return Code(le32(page, at+OffResult)), le32(page, at+OffValue)
}

func le32(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }

// ErrFull is returned by Encoder.Add when the call does not fit.
var ErrFull = errors.New("hypercall: slot page full")

// Encoder builds a slot page on the guest side: one call, or a multicall
// of several.
type Encoder struct {
	specs map[Op]Spec
	buf   [PageSize]byte
	at    []int // header offsets of the calls added
	used  int   // bytes of argument area used (multicall entries)
	multi bool
}

// NewEncoder returns an Encoder; with multi it builds a multicall.
func NewEncoder(multi bool) *Encoder {
	e := &Encoder{specs: map[Op]Spec{}, multi: multi}
	for _, s := range Specs() {
		e.specs[s.Op] = s
	}
	e.Reset()
	return e
}

// Reset empties the encoder.
func (e *Encoder) Reset() {
	clear(e.buf[:])
	e.at, e.used = e.at[:0], 0
}

// Len returns how many calls were added.
func (e *Encoder) Len() int { return len(e.at) }

// Add appends a call (its Op and fields). Without multi an Encoder holds
// one call.
func (e *Encoder) Add(c Call) error {
	s, ok := e.specs[c.Op]
	if !ok || c.Op == OpMulticall {
		return ErrNoSys
	}
	elems := len(c.PTEs)
	if s.Elem == 4 {
		elems = len(c.Points)
	}
	n := s.Fixed + elems*s.Elem
	if s.Elem > 0 && (c.Count != uint32(elems) || elems > s.MaxElems) {
		return ErrInval
	}
	var at int
	switch {
	case !e.multi && len(e.at) > 0:
		return ErrFull
	case !e.multi:
		at = 0
	default:
		if len(e.at) == MaxMulticall || HeaderSize+e.used+HeaderSize+pad8(n) > PageSize {
			return ErrFull
		}
		at = HeaderSize + e.used
		e.used += HeaderSize + pad8(n)
	}
	b := e.buf[:]
	binary.LittleEndian.PutUint32(b[at+OffOp:], uint32(c.Op))
	binary.LittleEndian.PutUint32(b[at+OffLen:], uint32(n))
	args := b[at+HeaderSize:]
	for _, f := range s.Fields {
		if f.Size == 8 {
			binary.LittleEndian.PutUint64(args[f.Off:], c.get(f.Name))
		} else {
			binary.LittleEndian.PutUint32(args[f.Off:], uint32(c.get(f.Name)))
		}
	}
	for i, p := range c.PTEs {
		binary.LittleEndian.PutUint64(args[s.Fixed+i*s.Elem:], p)
	}
	for i, p := range c.Points {
		binary.LittleEndian.PutUint32(args[s.Fixed+i*s.Elem:], p)
	}
	e.at = append(e.at, at)
	if e.multi {
		binary.LittleEndian.PutUint32(b[OffOp:], uint32(OpMulticall))
		binary.LittleEndian.PutUint32(b[OffLen:], uint32(e.used))
	}
	return nil
}

// Page returns the encoded slot page.
func (e *Encoder) Page() []byte { return e.buf[:] }

// At returns the header offset of the i-th call added.
func (e *Encoder) At(i int) int { return e.at[i] }
