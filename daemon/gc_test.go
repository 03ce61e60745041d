package daemon

import (
	"runtime"
	"slices"
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

// TestGrowthLift: a lift raises the GC's growth to startGCPercent over
// what tuneGC wants, lifts nest, a restore is once, and a want that
// comes during a lift is applied when the last lift ends.
func TestGrowthLift(t *testing.T) {
	var set []int
	g := growth{set: func(p int) int { set = append(set, p); return 0 }}
	applied := func() int { return set[len(set)-1] }
	g.want(largeGCPercent)
	r1 := g.lift()
	if applied() != startGCPercent {
		t.Fatalf("lifted: %d, want %d", applied(), startGCPercent)
	}
	r2 := g.lift()
	g.want(defaultGCPercent) // the config grew or shrank meanwhile
	r1()
	r1() // a second restore of the same lift does nothing
	if applied() != startGCPercent {
		t.Fatalf("one of two lifts restored (once twice): %d, want still %d", applied(), startGCPercent)
	}
	r2()
	if applied() != defaultGCPercent {
		t.Fatalf("every lift restored: %d, want tuneGC's latest %d", applied(), defaultGCPercent)
	}
	g.want(200) // above the lift's: a lift never lowers it
	g.lift()()
	if want := []int{largeGCPercent, startGCPercent, defaultGCPercent, 200}; !slices.Equal(set, want) {
		t.Fatalf("applied %v, want %v (each change once)", set, want)
	}
}
