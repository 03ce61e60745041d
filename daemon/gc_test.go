package daemon

import "testing"

func TestGCPercentFor(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, 100}, {smallConfig, 100},
		{smallConfig + 1, defaultGCPercent}, {largeConfig - 1, defaultGCPercent},
		{largeConfig, largeGCPercent}, {1_000_000, largeGCPercent},
	} {
		if got := gcPercentFor(tc.n); got != tc.want {
			t.Errorf("gcPercentFor(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}
