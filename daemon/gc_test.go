package daemon

import (
	"os"
	"runtime"
	"testing"
)

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

func TestTuneProcs(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set: tuneProcs leaves it alone")
	}
	reset := func() { procsSet.Store(0); runtime.SetDefaultGOMAXPROCS() }
	reset()
	t.Cleanup(reset)
	def := runtime.GOMAXPROCS(0)
	for _, tc := range []struct{ n, want int }{
		{0, 1}, {oneProcConfig, 1}, {oneProcConfig + 1, def}, {1_000_000, def}, {10, 1}, {10, 1},
	} {
		tuneProcs(tc.n)
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("after tuneProcs(%d): GOMAXPROCS %d, want %d", tc.n, got, tc.want)
		}
	}
}
