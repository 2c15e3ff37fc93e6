package kernels

import (
	"fmt"
	"math"
	"slices"
)

// SradROI is a rectangle of an SRAD image, rows R1..R2 and columns C1..C2
// inclusive (Rodinia's r1, r2, c1, c2).
type SradROI struct{ R1, R2, C1, C2 int }

// SradF32 is the host reference of the srad workload (Rodinia's srad_v1): the
// rows×cols image img mapped to exp(img/255), iters diffusion steps whose
// speckle scale comes from the statistics of the whole image (summed in
// chunks of SradReduceChunk pixels), and the result mapped back to
// log(·)·255. img is not modified. It panics unless len(img) is rows·cols.
func SradF32(img []float32, rows, cols, iters int, lambda float32) []float32 {
	checkGrid(img, rows, cols)
	j := make([]float32, len(img))
	for i, v := range img {
		j[i] = float32(math.Exp(float64(v / 255)))
	}
	ne := float32(len(j))
	for range iters {
		var sum, sum2 float32
		for c0 := 0; c0 < len(j); c0 += SradReduceChunk {
			var s, s2 float32
			for _, v := range j[c0:min(c0+SradReduceChunk, len(j))] {
				s += v
				s2 += float32(v * v)
			}
			sum += s
			sum2 += s2
		}
		refSradStep(j, rows, cols, refQ0sqr(sum, sum2, ne), lambda)
	}
	for i, v := range j {
		j[i] = float32(math.Log(float64(v))) * 255
	}
	return j
}

// SradV2F32 is the host reference of the srad2 workload (Rodinia's srad_v2):
// iters diffusion steps of the rows×cols image j, each with the speckle
// scale of the region roi summed row by row in float32. j is not modified.
// It panics unless len(j) is rows·cols and roi lies in the image.
func SradV2F32(j []float32, rows, cols int, roi SradROI, iters int, lambda float32) []float32 {
	checkGrid(j, rows, cols)
	if roi.R1 < 0 || roi.R1 > roi.R2 || roi.R2 >= rows || roi.C1 < 0 || roi.C1 > roi.C2 || roi.C2 >= cols {
		panic(fmt.Sprintf("kernels: srad region %+v outside a %d×%d image", roi, rows, cols))
	}
	img := slices.Clone(j)
	size := float32((roi.R2 - roi.R1 + 1) * (roi.C2 - roi.C1 + 1))
	for range iters {
		var sum, sum2 float32
		for y := roi.R1; y <= roi.R2; y++ {
			for x := roi.C1; x <= roi.C2; x++ {
				v := img[y*cols+x]
				sum += v
				sum2 += float32(v * v)
			}
		}
		refSradStep(img, rows, cols, refQ0sqr(sum, sum2, size), lambda)
	}
	return img
}

// refQ0sqr is the speckle scale of a region of n pixels with the given sum
// and sum of squares: its variance over its squared mean.
func refQ0sqr(sum, sum2, n float32) float32 {
	mean := sum / n
	variance := sum2/n - float32(mean*mean)
	return variance / float32(mean*mean)
}

// refSradStep is one SRAD diffusion step of the rows×cols image j, in place:
// the neighbour differences and diffusion coefficients of every pixel, then
// the update of every pixel.
func refSradStep(j []float32, rows, cols int, q0sqr, lambda float32) {
	n := len(j)
	dn, ds, dw, de, c := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for y := range rows {
		for x := range cols {
			k := y*cols + x
			jc := j[k]
			dn[k] = j[max(y-1, 0)*cols+x] - jc
			ds[k] = j[min(y+1, rows-1)*cols+x] - jc
			dw[k] = j[y*cols+max(x-1, 0)] - jc
			de[k] = j[y*cols+min(x+1, cols-1)] - jc
			g2 := float32(dn[k]*dn[k]) + float32(ds[k]*ds[k])
			g2 = g2 + float32(dw[k]*dw[k])
			g2 = g2 + float32(de[k]*de[k])
			g2 = g2 / float32(jc*jc)
			l := (dn[k] + ds[k] + dw[k] + de[k]) / jc
			num := float32(0.5*g2) - float32(0.0625*float32(l*l))
			den := 1 + float32(0.25*l)
			qsqr := num / float32(den*den)
			den = (qsqr - q0sqr) / float32(q0sqr*(1+q0sqr))
			c[k] = 1 / (1 + den)
			if c[k] < 0 {
				c[k] = 0
			}
			if c[k] > 1 {
				c[k] = 1
			}
		}
	}
	for y := range rows {
		for x := range cols {
			k := y*cols + x
			cs := c[min(y+1, rows-1)*cols+x]
			ce := c[y*cols+min(x+1, cols-1)]
			d := float32(c[k]*dn[k]) + float32(cs*ds[k])
			d = d + float32(c[k]*dw[k])
			d = d + float32(ce*de[k])
			j[k] = j[k] + float32(float32(0.25*lambda)*d)
		}
	}
}

// checkGrid panics unless g holds rows·cols elements.
func checkGrid[T any](g []T, rows, cols int) {
	if rows < 1 || cols < 1 || len(g) != rows*cols {
		panic(fmt.Sprintf("kernels: grid has %d elements, want %d×%d", len(g), rows, cols))
	}
}
