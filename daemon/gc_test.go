package daemon

import (
	"runtime"
	"strconv"
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
	reset := func() { procsSet.Store(0); runtime.SetDefaultGOMAXPROCS() }
	reset()
	t.Cleanup(reset)
	// Go's default, whatever the environment running the test says.
	def := runtime.GOMAXPROCS(0)

	t.Setenv("GOMAXPROCS", "")
	for _, tc := range []struct{ n, want int }{
		{0, 1}, {oneProcConfig, 1}, {oneProcConfig + 1, def}, {1_000_000, def}, {10, 1}, {10, 1},
	} {
		tuneProcs(tc.n)
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("after tuneProcs(%d): GOMAXPROCS %d, want %d", tc.n, got, tc.want)
		}
	}

	// An operator's GOMAXPROCS wins: tuneProcs changes nothing.
	reset()
	t.Setenv("GOMAXPROCS", strconv.Itoa(def))
	tuneProcs(10)
	if got := runtime.GOMAXPROCS(0); got != def || procsSet.Load() != 0 {
		t.Errorf("with GOMAXPROCS=%d in the environment, tuneProcs(10) set it to %d (applied %d)", def, got, procsSet.Load()-1)
	}
}
