package gpu

// Range is a byte range of a GPU's memory: [Base, Base+Size).
type Range struct{ Base, Size uint64 }

// End is one past the range's last byte.
func (r Range) End() uint64 { return r.Base + r.Size }
