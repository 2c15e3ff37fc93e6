package bench

// PublishedRatio returns GPUvm's published execution time for a workload
// under a mode, normalised to native (thesis Fig. 4.8), and whether one is
// known. Values were read from the figure's labels; where the extracted
// label is illegible the value is left out rather than guessed: a label
// cut short ("106.", "21."), with digits that do not fit its bar or its
// neighbours ("2.8 33", "51.84 1"), or a value the extraction set beside
// merged row labels unless every candidate row shows it (fmadd's and nn's
// PVDRM). The Rodinia workloads (bp … srad2) lost more labels than the
// micro-benchmarks.
func PublishedRatio(mode, workload string) (float64, bool) {
	r, ok := published()[workload][mode]
	return r, ok
}

func published() map[string]map[string]float64 {
	return map[string]map[string]float64{
		"nop":    {"fv-naive": 389.11, "fv-bar-remap": 146.58, "fv-lazy": 284.33, "fv-optimized": 52.2, "pv-naive": 25.68, "pv-multicall": 2.98, "pvdrm": 1.25, "pvdrm-pooling": 1.05},
		"loop":   {"fv-naive": 320.76, "fv-lazy": 230.60, "fv-optimized": 50.2, "pv-naive": 30.10, "pv-multicall": 12.50, "pvdrm": 1.20, "pvdrm-pooling": 1.06},
		"madd":   {"fv-naive": 267.76, "fv-lazy": 186.24, "fv-optimized": 37.95, "pv-naive": 17.60, "pv-multicall": 2.30, "pvdrm": 1.25, "pvdrm-pooling": 1.08},
		"mmul":   {"fv-naive": 22.26, "fv-bar-remap": 9.45, "fv-lazy": 16.15, "fv-optimized": 3.97, "pv-naive": 2.34, "pv-multicall": 1.11, "pvdrm": 1.02, "pvdrm-pooling": 1.01},
		"fmadd":  {"fv-naive": 272.78, "fv-lazy": 196.59, "pvdrm": 1.25},
		"fmmul":  {"fv-naive": 262.63, "fv-lazy": 190.05, "pv-naive": 17.66, "pv-multicall": 2.32, "pvdrm": 1.25, "pvdrm-pooling": 1.08},
		"cpy":    {"fv-bar-remap": 30.17, "fv-lazy": 68.92, "pv-naive": 7.54, "pv-multicall": 1.55, "pvdrm": 1.14, "pvdrm-pooling": 1.01},
		"pincpy": {"fv-naive": 63.19, "fv-lazy": 7.45, "fv-optimized": 7.70, "pv-multicall": 1.48, "pvdrm-pooling": 0.97},
		"bp":     {"pv-multicall": 2.19, "pvdrm": 1.16, "pvdrm-pooling": 1.02},
		"hs":     {"pv-naive": 20.87, "pvdrm": 1.21, "pvdrm-pooling": 1.07},
		"lud":    {"fv-bar-remap": 64.48, "fv-lazy": 126.25, "pv-multicall": 1.98, "pvdrm": 1.11, "pvdrm-pooling": 1.03},
		"nn":     {"pvdrm": 1.24},
		"srad":   {"fv-lazy": 21.54, "pv-multicall": 1.98, "pvdrm": 1.03, "pvdrm-pooling": 1.02},
		"srad2":  {"fv-lazy": 26.41, "pv-naive": 3.31, "pv-multicall": 1.19, "pvdrm": 1.03, "pvdrm-pooling": 1.00},
	}
}

// PublishedHypercalls returns GPUvm's hypercall counts for a workload
// without and with multicall (thesis Table 4.1), and whether it published
// them.
func PublishedHypercalls(workload string) (without, with uint64, ok bool) {
	t := map[string][2]uint64{
		"nop": {11383, 118}, "loop": {11383, 118}, "madd": {11573, 122}, "mmul": {11573, 122},
		"fmadd": {11573, 122}, "fmmul": {11573, 122}, "cpy": {12163, 105}, "pincpy": {44937, 122},
		"bp": {11777, 137}, "hs": {11429, 122}, "lud": {11783, 114}, "nn": {11469, 118},
		"srad": {12379, 185}, "srad2": {13031, 133},
	}
	v, ok := t[workload]
	return v[0], v[1], ok
}
