package kernels

import (
	"encoding/binary"
	"math"
)

// DecodeU32s decodes p as little-endian uint32 words. Trailing bytes that do
// not form a whole word are ignored.
func DecodeU32s(p []byte) []uint32 {
	v := make([]uint32, len(p)/4)
	decodeU32sInto(v, p)
	return v
}

// EncodeU32s encodes v as little-endian uint32 words (4·len(v) bytes).
func EncodeU32s(v []uint32) []byte {
	p := make([]byte, 4*len(v))
	encodeU32sInto(p, v)
	return p
}

// DecodeF32s decodes p as little-endian IEEE 754 float32 values, preserving
// every bit pattern (including NaN payloads). Trailing bytes that do not form
// a whole value are ignored.
func DecodeF32s(p []byte) []float32 {
	v := make([]float32, len(p)/4)
	decodeF32sInto(v, p)
	return v
}

// EncodeF32s encodes v as little-endian IEEE 754 float32 values (4·len(v)
// bytes), preserving every bit pattern.
func EncodeF32s(v []float32) []byte {
	p := make([]byte, 4*len(v))
	encodeF32sInto(p, v)
	return p
}

// decodeU32sInto decodes p into v (len(v) words).
func decodeU32sInto(v []uint32, p []byte) {
	for i := range v {
		v[i] = binary.LittleEndian.Uint32(p[4*i:])
	}
}

// encodeU32sInto encodes v into p (4·len(v) bytes).
func encodeU32sInto(p []byte, v []uint32) {
	for i, x := range v {
		binary.LittleEndian.PutUint32(p[4*i:], x)
	}
}

// decodeF32sInto decodes p into v, preserving every bit pattern.
func decodeF32sInto(v []float32, p []byte) {
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
	}
}

// encodeF32sInto encodes v into p, preserving every bit pattern.
func encodeF32sInto(p []byte, v []float32) {
	for i, x := range v {
		binary.LittleEndian.PutUint32(p[4*i:], math.Float32bits(x))
	}
}
