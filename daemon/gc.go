package daemon

import (
	"os"
	"runtime/debug"
	"sync/atomic"
)

// defaultGCPercent is beatd's GOGC while it starts, unless the
// environment sets one. Parsing a large config makes a lot of garbage, and
// collecting at 30% growth keeps the heap near its live size: with 100k
// entries and the embedded etcd, peak RSS ~198 MiB instead of ~218 MiB at
// 50 (and more at the default 100), for ~0.1 s more start-up.
const defaultGCPercent = 30

// smallConfig is the most entries for which, once started, beatd runs
// the GC at Go's default 100% growth: a small heap collected at 50% is
// collected twice as often, which cost ~10% of the CPU per fire at 1,000
// entries firing every second, for a few MiB of RSS.
const smallConfig = 10_000

func setGCPercent() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// tuneGC picks the GC's growth for a config of n entries, after the
// sources are read and whenever the running config changes size. A large
// config keeps the start-up's tight growth: a leader's first term
// (baselines for every entry, the first state write) comes after this,
// and a large heap's headroom is what costs RSS; a config the entries API
// grows past smallConfig at run time gets it too.
func tuneGC(n int) {
	if os.Getenv("GOGC") != "" {
		return
	}
	small := n <= smallConfig
	if gcSmall.Swap(small) != small || !gcTuned.Swap(true) {
		if small {
			debug.SetGCPercent(100)
		} else {
			debug.SetGCPercent(defaultGCPercent)
		}
	}
}

// gcSmall is the growth tuneGC last set (true: 100%); gcTuned says it set
// one.
var gcSmall, gcTuned atomic.Bool
