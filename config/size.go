package config

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"
)

// Size is an amount of memory in bytes. In a configuration file it is written
// either as a TOML integer (bytes) or as a string with a binary unit:
// "6GiB", "512MiB", "64KiB", "1.5GiB", "4096", "4096B".
type Size uint64

// Binary size units.
const (
	B   Size = 1
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

// sizeUnits returns the accepted unit suffixes, largest first.
func sizeUnits() []struct {
	name string
	mult Size
} {
	return []struct {
		name string
		mult Size
	}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}, {"B", B}}
}

// ParseSize parses a size: a non-negative decimal number, optionally with a
// fraction, followed by an optional unit B, KiB, MiB, GiB or TiB (binary
// multiples; an optional space may separate number and unit). A number
// without a unit is in bytes. The result must be a whole number of bytes and
// fit in 64 bits.
func ParseSize(s string) (Size, error) {
	orig := s
	s = strings.TrimSpace(s)
	bad := func(format string, args ...any) (Size, error) {
		return 0, fmt.Errorf("invalid size %q: %s", orig, fmt.Sprintf(format, args...))
	}
	if s == "" {
		return bad("empty")
	}
	if s[0] == '-' {
		return bad("negative")
	}
	if s[0] == '+' {
		s = s[1:]
	}
	// Split the number from the unit.
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.' || s[i] == '_') {
		i++
	}
	num, unit := s[:i], strings.TrimSpace(s[i:])
	if num == "" {
		return bad("no number")
	}
	mult := Size(0)
	if unit == "" {
		mult = B
	} else {
		for _, u := range sizeUnits() {
			if unit == u.name {
				mult = u.mult
				break
			}
		}
		if mult == 0 {
			return bad("unknown unit %q (use B, KiB, MiB, GiB or TiB)", unit)
		}
	}
	intPart, frac, hasDot := strings.Cut(num, ".")
	if hasDot && frac == "" || intPart == "" && frac == "" {
		return bad("malformed number %q", num)
	}
	if strings.Contains(frac, ".") {
		return bad("malformed number %q", num)
	}
	n, err := parseDigits(intPart)
	if err != nil {
		return bad("%s", err)
	}
	hi, total := bits.Mul64(n, uint64(mult))
	if hi != 0 {
		return bad("overflows 64 bits")
	}
	if frac != "" {
		// frac/10^k × mult must be a whole number of bytes.
		f, err := parseDigits(frac)
		if err != nil {
			return bad("%s", err)
		}
		if len(frac) > 19 {
			return bad("too many fraction digits")
		}
		den := uint64(1)
		for range len(frac) {
			den *= 10
		}
		fh, fl := bits.Mul64(f, uint64(mult))
		if fh >= den {
			return bad("overflows 64 bits")
		}
		q, r := bits.Div64(fh, fl, den)
		if r != 0 {
			return bad("not a whole number of bytes")
		}
		var carry uint64
		total, carry = bits.Add64(total, q, 0)
		if carry != 0 {
			return bad("overflows 64 bits")
		}
	}
	return Size(total), nil
}

// parseDigits parses a run of decimal digits (underscores allowed between
// digits, as in TOML integers) into a uint64.
func parseDigits(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	if s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return 0, fmt.Errorf("misplaced underscore in %q", s)
	}
	var n uint64
	for _, c := range []byte(s) {
		if c == '_' {
			continue
		}
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("bad digit %q", c)
		}
		if n > (math.MaxUint64-uint64(c-'0'))/10 {
			return 0, errors.New("overflows 64 bits")
		}
		n = n*10 + uint64(c-'0')
	}
	return n, nil
}

// String returns the size in the largest binary unit that represents it
// exactly, e.g. "6GiB", "512MiB", "1536KiB", "1000B", "0B". ParseSize
// accepts the result.
func (s Size) String() string {
	for _, u := range sizeUnits() {
		if s != 0 && s%u.mult == 0 {
			return fmt.Sprintf("%d%s", uint64(s/u.mult), u.name)
		}
	}
	return "0B"
}

// Bytes returns the size as a plain byte count.
func (s Size) Bytes() uint64 { return uint64(s) }

// MarshalText implements encoding.TextMarshaler; it returns String().
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler using ParseSize. A TOML
// integer reaches it as its decimal digits (BurntSushi/toml formats it so),
// which ParseSize reads as bytes; a negative integer is rejected.
func (s *Size) UnmarshalText(text []byte) error {
	v, err := ParseSize(string(text))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Duration is a time span written as a Go duration string ("100ms", "500us",
// "2s", "1m30s"). The integer 0 and the string "0" are also accepted.
// Durations in the configuration are never negative.
type Duration struct {
	time.Duration
}

// ParseDuration parses a non-negative Go duration string (see
// time.ParseDuration).
func ParseDuration(s string) (Duration, error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "-") {
		return Duration{}, fmt.Errorf("invalid duration %q: negative", s)
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return Duration{}, fmt.Errorf("invalid duration %q: %w", s, err)
	}
	return Duration{d}, nil
}

// MarshalText implements encoding.TextMarshaler; it returns the Go duration
// string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.Duration.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler using ParseDuration.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := ParseDuration(string(text))
	if err != nil {
		return err
	}
	*d = v
	return nil
}
