package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    Size
		wantErr string // substring; empty = no error
	}{
		{in: "0", want: 0},
		{in: "0B", want: 0},
		{in: "0GiB", want: 0},
		{in: "1", want: 1},
		{in: "4096", want: 4096},
		{in: "4096B", want: 4096},
		{in: "64KiB", want: 64 * KiB},
		{in: "512MiB", want: 512 * MiB},
		{in: "6GiB", want: 6 * GiB},
		{in: "2TiB", want: 2 * TiB},
		{in: "6 GiB", want: 6 * GiB},
		{in: " 6GiB ", want: 6 * GiB},
		{in: "+1MiB", want: MiB},
		{in: "1.5GiB", want: 1536 * MiB},
		{in: "0.5KiB", want: 512},
		{in: "1_024MiB", want: GiB},
		{in: "18446744073709551615", want: 1<<64 - 1},
		{in: "16777215TiB", want: 16777215 * TiB},
		{in: "1.25KiB", want: 1280},
		{in: "0.0009765625KiB", want: 1},
		{in: "", wantErr: "empty"},
		{in: "   ", wantErr: "empty"},
		{in: "-1", wantErr: "negative"},
		{in: "-0", wantErr: "negative"},
		{in: "-1GiB", wantErr: "negative"},
		{in: "18446744073709551616", wantErr: "overflows 64 bits"},
		{in: "16777216TiB", wantErr: "overflows 64 bits"},
		{in: "99999999999999999999999GiB", wantErr: "overflows 64 bits"},
		{in: "6GB", wantErr: `unknown unit "GB"`},
		{in: "6gib", wantErr: `unknown unit "gib"`},
		{in: "6 G", wantErr: `unknown unit "G"`},
		{in: "GiB", wantErr: "no number"},
		{in: "1.GiB", wantErr: "malformed number"},
		{in: "1..5GiB", wantErr: "malformed number"},
		{in: "1.2.3MiB", wantErr: "malformed number"},
		{in: ".", wantErr: "malformed number"},
		{in: "0.1B", wantErr: "not a whole number of bytes"},
		{in: "1.1KiB", wantErr: "not a whole number of bytes"},
		{in: "_1MiB", wantErr: "underscore"},
		{in: "1__0", wantErr: "underscore"},
		{in: "0x10", wantErr: `unknown unit "x10"`},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSize(%q) = %d, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestSizeString(t *testing.T) {
	tests := []struct {
		in   Size
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1000, "1000B"},
		{KiB, "1KiB"},
		{1536 * KiB, "1536KiB"},
		{512 * MiB, "512MiB"},
		{6 * GiB, "6GiB"},
		{8448 * MiB, "8448MiB"},
		{1024 * TiB, "1024TiB"},
		{1<<64 - 1, "18446744073709551615B"},
	}
	for _, tt := range tests {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("Size(%d).String() = %q, want %q", uint64(tt.in), got, tt.want)
		}
		back, err := ParseSize(tt.want)
		if err != nil || back != tt.in {
			t.Errorf("ParseSize(%q) = %d, %v; want %d (round trip)", tt.want, back, err, uint64(tt.in))
		}
	}
}

func TestSizeText(t *testing.T) {
	var s Size
	if err := s.UnmarshalText([]byte("6442450944")); err != nil || s != 6*GiB {
		t.Errorf("UnmarshalText(integer) = %v, %v", s, err)
	}
	if err := s.UnmarshalText([]byte("-5")); err == nil {
		t.Error("UnmarshalText(-5) succeeded")
	}
	b, err := (512 * MiB).MarshalText()
	if err != nil || string(b) != "512MiB" {
		t.Errorf("MarshalText = %q, %v", b, err)
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{in: "0", want: 0},
		{in: "0s", want: 0},
		{in: "100ms", want: 100 * time.Millisecond},
		{in: "500us", want: 500 * time.Microsecond},
		{in: "500µs", want: 500 * time.Microsecond},
		{in: "1m30s", want: 90 * time.Second},
		{in: "2562047h", want: 2562047 * time.Hour},
		{in: "", wantErr: "invalid duration"},
		{in: "-5ms", wantErr: "negative"},
		{in: "-0s", wantErr: "negative"},
		{in: "100", wantErr: "missing unit"},
		{in: "5parsecs", wantErr: "unknown unit"},
		{in: "5 ms", wantErr: "invalid duration"},
		{in: "9999999999h", wantErr: "invalid duration"},
		{in: "2562048h", wantErr: "invalid duration"},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseDuration(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got.Duration != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestDurationText(t *testing.T) {
	var d Duration
	if err := d.UnmarshalText([]byte("30ms")); err != nil || d.Duration != 30*time.Millisecond {
		t.Errorf("UnmarshalText = %v, %v", d, err)
	}
	b, err := d.MarshalText()
	if err != nil || string(b) != "30ms" {
		t.Errorf("MarshalText = %q, %v", b, err)
	}
}
