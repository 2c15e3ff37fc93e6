package svgplot

import (
	"math"
	"strconv"
)

// eps absorbs floating-point error when snapping to tick multiples.
const eps = 1e-9

// maxTicks bounds the number of ticks a scale may have.
const maxTicks = 50

// scale maps data values to a fraction of an axis and holds the axis ticks.
type scale struct {
	lo, hi float64 // axis range; log10 of the values for a log scale
	log    bool
	ticks  []float64 // tick values (data values, not logarithms)
	labels []string  // formatted ticks, same length as ticks
}

// frac maps v to its position on the axis, 0 at lo and 1 at hi.
func (s scale) frac(v float64) float64 {
	if s.log {
		v = math.Log10(v)
	}
	return (v - s.lo) / (s.hi - s.lo)
}

// niceStep returns a tick step of 1, 2 or 5 times a power of ten, giving
// about target intervals over span (span > 0, target >= 1).
func niceStep(span float64, target int) float64 {
	raw := span / float64(target)
	mag := math.Pow10(int(math.Floor(math.Log10(raw))))
	n := raw / mag
	switch {
	case n <= 1+eps:
		return mag
	case n <= 2+eps:
		return 2 * mag
	case n <= 5+eps:
		return 5 * mag
	}
	return 10 * mag
}

// linearScale builds a linear scale covering [dmin, dmax] with about target
// tick intervals. Bounds given as fixedLo/fixedHi are used exactly; the
// others are extended outwards to a multiple of the tick step. A zero-width
// range is widened (upwards when possible): [0, 0] becomes [0, 1].
func linearScale(dmin, dmax float64, fixedLo, fixedHi *float64, target int) (scale, error) {
	lo, hi := dmin, dmax
	if fixedLo != nil {
		lo = *fixedLo
	}
	if fixedHi != nil {
		hi = *fixedHi
	}
	if !finite(lo) || !finite(hi) {
		return scale{}, wrap(ErrInvalidRange, "axis bounds %v..%v are not finite", lo, hi)
	}
	if lo > hi || (lo == hi && fixedLo != nil && fixedHi != nil) {
		return scale{}, wrap(ErrInvalidRange, "axis minimum %v not below maximum %v", lo, hi)
	}
	if lo == hi {
		d := math.Abs(lo) * 0.1
		if d == 0 {
			d = 1
		}
		if fixedHi == nil {
			hi += d
		} else {
			lo -= d
		}
	}
	span := hi - lo
	if !finite(span) {
		return scale{}, wrap(ErrInvalidRange, "axis range %v..%v too large", lo, hi)
	}
	target = max(target, 1)
	step := niceStep(span, target)
	if !(step > 0) || !finite(step) || span/step > maxTicks {
		return scale{}, wrap(ErrInvalidRange, "axis range %v..%v cannot be divided into ticks", lo, hi)
	}
	if fixedLo == nil {
		lo = math.Floor(lo/step+eps) * step
	}
	if fixedHi == nil {
		hi = math.Ceil(hi/step-eps) * step
	}
	if !finite(lo) || !finite(hi) || !(lo < hi) {
		return scale{}, wrap(ErrInvalidRange, "axis range %v..%v too large", lo, hi)
	}
	s := scale{lo: lo, hi: hi}
	kLo := math.Ceil(lo/step - eps)
	kHi := math.Floor(hi/step + eps)
	for k := kLo; k <= kHi && len(s.ticks) <= maxTicks; k++ {
		t := k * step
		if t == 0 {
			t = 0 // avoid -0
		}
		s.ticks = append(s.ticks, t)
		s.labels = append(s.labels, formatTick(t, step))
	}
	return s, nil
}

// formatTick formats a linear tick value with as many decimals as the
// step needs, switching to exponent notation for very large or small
// values.
func formatTick(v, step float64) string {
	if v == 0 {
		return "0"
	}
	dec := int(-math.Floor(math.Log10(step) + eps))
	if math.Abs(v) >= 1e7 || dec > 6 {
		s := strconv.FormatFloat(v, 'g', 6, 64)
		return s
	}
	s := strconv.FormatFloat(v, 'f', max(dec, 0), 64)
	if s == "-0" || s == "-0.0" {
		s = "0"
	}
	return s
}

// logScale builds a base-10 logarithmic scale covering [dmin, dmax]
// (0 < dmin <= dmax), extended to powers of ten, with ticks at powers of ten.
// When there would be more than maxLogTicks ticks only every n-th power is
// labelled.
func logScale(dmin, dmax float64) (scale, error) {
	if !(dmin > 0) || !finite(dmin) || !finite(dmax) || dmax < dmin {
		return scale{}, wrap(ErrInvalidRange, "logarithmic axis range %v..%v", dmin, dmax)
	}
	lo := math.Floor(math.Log10(dmin) + eps)
	hi := math.Ceil(math.Log10(dmax) - eps)
	if hi <= lo {
		hi = lo + 1
	}
	s := scale{lo: lo, hi: hi, log: true}
	stride := int(math.Ceil((hi - lo + 1) / maxLogTicks))
	for e := int(lo); e <= int(hi); e += stride {
		s.ticks = append(s.ticks, math.Pow10(e))
		s.labels = append(s.labels, formatPow10(e))
	}
	return s, nil
}

const maxLogTicks = 10

// formatPow10 formats 10^e: plainly ("0.001", "1000") for moderate e,
// otherwise in exponent notation ("1e-5", "1e7").
func formatPow10(e int) string {
	if e >= -4 && e <= 6 {
		return strconv.FormatFloat(math.Pow10(e), 'f', -1, 64)
	}
	return "1e" + strconv.Itoa(e)
}
