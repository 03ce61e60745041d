package daemon

import (
	"os"
	"runtime"
	"runtime/debug"
	"sync"
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

// largeConfig is the fewest entries for which the GC runs at
// largeGCPercent. A heap of a gigabyte and more (~1.2 KB an entry) grown
// by 30% holds hundreds of MB of garbage: at a million entries RSS was
// 1.76 GB over a 1.2 GB live heap. Its garbage comes slowly (a few MB a
// second at ~300 fires/s), so collecting at 15% costs a GC every half
// minute or so.
const (
	largeConfig    = 250_000
	largeGCPercent = 15
)

func setGCPercent() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// gcPercentFor is the GC's growth for a running config of n entries.
func gcPercentFor(n int) int {
	switch {
	case n <= smallConfig:
		return 100
	case n >= largeConfig:
		return largeGCPercent
	default:
		return defaultGCPercent
	}
}

// tuneRuntime fits the Go runtime to a config of n entries, after the
// sources are read and whenever the running config changes size: the
// GC's growth and the number of processors that run Go code.
func tuneRuntime(n int) {
	tuneGC(n)
	tuneProcs(n)
}

// tuneGC picks the GC's growth for a config of n entries. A
// mid-sized config keeps the start-up's tight growth: a leader's first
// term (baselines for every entry, the first state write) comes after
// this, and a large heap's headroom is what costs RSS; a config the
// entries API grows past smallConfig at run time gets it too.
func tuneGC(n int) {
	if os.Getenv("GOGC") != "" {
		return
	}
	gcGrowth.want(gcPercentFor(n))
}

// startGCPercent is the GC's growth while a shard's term starts
// (liftGC). A move's start decodes the shard's state and schedules each
// entry, ~26 MB of allocations at 56,000 entries, on a replica whose heap
// is several hundred MB collected at 15 % growth: when a collection is
// under way every byte allocated pays for marking several more, and a
// start that takes 50 ms alone ran for 1.2-1.5 s in a move's execution
// trace (900,000 entries, 16 shards). At 100 % the same collection asks
// almost no assist. The start's own allocations are what the heap grows by
// meanwhile (shardSet starts no shard load while a term starts, and does
// not lift the GC while one runs), well within the headroom 15 % leaves.
const startGCPercent = 100

// liftGC raises the GC's growth to startGCPercent until the returned
// restore is called, unless the environment sets GOGC. Lifts nest.
func liftGC() (restore func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	return gcGrowth.lift()
}

// gcGrowth is the process's GC growth (it is the runtime's, one per
// process).
var gcGrowth = growth{set: debug.SetGCPercent}

// growth is the GC's growth as tuneGC wants it and as lifts raise it.
type growth struct {
	set func(int) int // debug.SetGCPercent

	mu      sync.Mutex
	wanted  int // tuneGC's choice (0: none yet, the start-up's setGCPercent)
	lifts   int
	applied int // what set was last given (0: nothing yet)
}

func (g *growth) want(p int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.wanted = p
	g.applyLocked()
}

func (g *growth) lift() (restore func()) {
	g.mu.Lock()
	g.lifts++
	g.applyLocked()
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.lifts--
			g.applyLocked()
			g.mu.Unlock()
		})
	}
}

func (g *growth) applyLocked() {
	p := g.wanted
	if p == 0 {
		p = defaultGCPercent // setGCPercent's, before tuneGC's first call
	}
	if g.lifts > 0 {
		p = max(p, startGCPercent)
	}
	if p != g.applied {
		g.set(p)
		g.applied = p
	}
}

// returnMemory collects the heap and returns its free memory to the OS,
// once a shard's entries are loaded (shardSet.prepare). A sharded
// replica's heap grows by steps, one shard's load at a time, and each
// load's garbage (~5 KB an entry parsed, against ~1 KB kept) is freed
// into pages the background scavenger hands back only slowly: at 900,000
// entries over 16 shards a replica's RSS held ~130 MB of free heap above
// its in-use heap, carried from load to load into its peak. A forced
// collection per load costs about what one of the load's own
// collections does (a load runs several).
func returnMemory() { debug.FreeOSMemory() }

// oneProcConfig is the most entries for which beatd runs Go code on one
// processor (GOMAXPROCS=1). A small config's work comes in small bursts
// and idle ticks (the embedded etcd's raft, watch and lease loops), and
// with a second processor the runtime wakes an idle thread to look for
// work around each of them: on 2 cores at 1,000 entries every second,
// ~20 % of the CPU per fire and ~30 % of the idle CPU went to that
// spinning. A burst of more than a few thousand fires gains from
// encoding on every core while the broker reads (5,000 entries broke
// even in alternated runs), so larger configs keep Go's default.
const oneProcConfig = 5_000

// procsFor is the GOMAXPROCS for a running config of n entries; 0 is
// Go's default (the CPUs the process may use).
func procsFor(n int) int {
	if n <= oneProcConfig {
		return 1
	}
	return 0
}

// tuneProcs sets GOMAXPROCS for a config of n entries, unless the
// environment sets it. Going back to Go's default also gives the runtime
// back its own updates of it (a changed CPU quota).
func tuneProcs(n int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	p := int32(procsFor(n))
	if procsSet.Swap(p+1) == p+1 {
		return
	}
	if p == 0 {
		runtime.SetDefaultGOMAXPROCS()
		return
	}
	runtime.GOMAXPROCS(int(p))
}

// procsSet is procsFor's value tuneProcs last applied, plus one (0: none
// yet).
var procsSet atomic.Int32
