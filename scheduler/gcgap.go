package scheduler

import (
	"runtime"
	"runtime/metrics"
	"sync/atomic"
)

// gcGap moves the garbage collector out of bursts. At 20,000 entries due
// each second the heap (~120 MB, most of it message templates) reaches
// its goal every few seconds, and a cycle that starts inside a burst
// takes a quarter of the CPU from the publish for its whole mark phase:
// the bursts it lands in were the slowest, and they set the p99 lag. So
// at the end of a burst, when the heap would reach its trigger in the
// next one, the loop starts the cycle there and then, in the idle gap.
// The GC runs no more often: that cycle replaces the one the next burst
// would have started. (GOGC itself is the daemon's: tuneGC.)
type gcGap struct {
	samples [4]metrics.Sample
	// ended is the heap's total allocation when the last burst ended.
	ended uint64
	// running: a cycle this started has not ended. Its goroutine ends
	// with the cycle (runtime.GC cannot be stopped), tens of ms.
	running atomic.Bool
}

const (
	gcAllocs  = "/gc/heap/allocs:bytes"
	gcGoal    = "/gc/heap/goal:bytes"
	gcLive    = "/gc/heap/live:bytes"
	gcObjects = "/memory/classes/heap/objects:bytes"
)

func (g *gcGap) read() (allocs, goal, live, objects uint64) {
	if g.samples[0].Name == "" {
		for i, name := range []string{gcAllocs, gcGoal, gcLive, gcObjects} {
			g.samples[i].Name = name
		}
	}
	metrics.Read(g.samples[:])
	v := func(i int) uint64 {
		if g.samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return g.samples[i].Value.Uint64()
	}
	return v(0), v(1), v(2), v(3)
}

// end is called as a burst's last batch is recorded. It starts a cycle
// if the heap, grown by what it allocated since the last burst ended (the
// gap and this burst: about what it will allocate until the next one
// ends), would pass the earliest point at which the pacer starts one,
// 70% of the way from the live heap to the goal. The first burst only
// marks where the next one's cycle starts.
func (g *gcGap) end() {
	allocs, goal, live, objects := g.read()
	cycle, first := allocs-g.ended, g.ended == 0
	g.ended = allocs
	if first || !gcDue(cycle, goal, live, objects) {
		return
	}
	if g.running.CompareAndSwap(false, true) {
		go func() {
			defer g.running.Store(false)
			runtime.GC()
		}()
	}
}

// gcDue says whether a heap of objects bytes, growing by cycle before the
// next burst ends, would pass 70% of the way from live to goal.
func gcDue(cycle, goal, live, objects uint64) bool {
	return goal > live && objects+cycle >= live+(goal-live)*7/10
}
