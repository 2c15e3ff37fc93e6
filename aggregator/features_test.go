package aggregator

import (
	"slices"
	"testing"

	"github.com/gpuvm/gpuvm/config"
)

// Every mode the configuration accepts is served, and nothing else: a
// [[vm]] mode that passes config checks never meets a refusal at connect.
func TestModesServed(t *testing.T) {
	var served []string
	for m := range modeFeatures() {
		served = append(served, string(m))
	}
	slices.Sort(served)
	accepted := slices.Sorted(slices.Values(config.ModeNames()))
	if !slices.Equal(served, accepted) {
		t.Errorf("modes with features %v, modes the config accepts %v", served, accepted)
	}
	for _, m := range Modes() {
		if _, err := FeaturesFor(m); err != nil || !IsServedMode(m) {
			t.Errorf("%s: %v", m, err)
		}
	}
	if _, err := FeaturesFor("pvdrm-turbo"); err == nil {
		t.Error("an unknown mode has features")
	}
	if f, _ := FeaturesFor("pvdrm-pooling"); !f.PVDRM || !f.Pooling || !f.PV || f.Remap {
		t.Errorf("pvdrm-pooling features %+v", f)
	}
}
