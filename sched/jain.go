package sched

// Jain returns Jain's fairness index of x, (Σx)² / (n·Σx²): 1 when all
// values are equal, 1/n when one value holds everything. It returns 1 for
// an all-zero vector (nobody got anything, equally) and 0 for an empty one.
// Values should be non-negative; to measure weighted fairness, divide each
// VM's usage by its weight first.
func Jain(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	var s, s2 float64
	for _, v := range x {
		s += v
		s2 += v * v
	}
	if s2 == 0 {
		return 1
	}
	return s * s / (float64(len(x)) * s2)
}
