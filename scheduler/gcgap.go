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
// The GC runs about as often: that cycle replaces the one the next burst
// would have started. (GOGC itself is the daemon's: tuneGC.)
type gcGap struct {
	samples [5]metrics.Sample
	// ended is the heap's total allocation when the last burst ended, and
	// cycles the count of GC cycles then.
	ended, cycles uint64
	// running: a cycle this started has not ended. Its goroutine ends
	// with the cycle (runtime.GC cannot be stopped), tens of ms.
	running atomic.Bool
}

const (
	gcAllocs  = "/gc/heap/allocs:bytes"
	gcGoal    = "/gc/heap/goal:bytes"
	gcLive    = "/gc/heap/live:bytes"
	gcObjects = "/memory/classes/heap/objects:bytes"
	gcCycles  = "/gc/cycles/total:gc-cycles"
)

// heapStats is what gcGap reads of the runtime.
type heapStats struct {
	allocs, goal, live, objects, cycles uint64
}

func (g *gcGap) read() heapStats {
	if g.samples[0].Name == "" {
		for i, name := range []string{gcAllocs, gcGoal, gcLive, gcObjects, gcCycles} {
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
	return heapStats{allocs: v(0), goal: v(1), live: v(2), objects: v(3), cycles: v(4)}
}

// end is called as a burst's last batch is recorded. It starts a cycle
// if the heap would reach the pacer's earliest trigger (70% of the way
// from the live heap to the goal) before the next burst ends, and none
// ran since the last burst ended. The first burst only marks where the
// next one's cycle starts.
func (g *gcGap) end() {
	if !g.due(g.read()) {
		return
	}
	if g.running.CompareAndSwap(false, true) {
		go func() {
			defer g.running.Store(false)
			runtime.GC()
		}()
	}
}

// due is end's decision on the runtime's figures h, read as a burst ends.
func (g *gcGap) due(h heapStats) bool {
	cycle, first, collected := h.allocs-g.ended, g.ended == 0, h.cycles != g.cycles
	g.ended, g.cycles = h.allocs, h.cycles
	// A cycle that ran since the last burst (the pacer's own, or one
	// this started) left the heap fresh, and its garbage not yet swept
	// still counts in objects: forcing another then was a second mark for
	// nothing.
	return !first && !collected && gcDue(cycle, h.goal, h.live, h.objects)
}

// gcDue says whether a heap of objects bytes, growing by cycle a burst,
// would pass 70% of the way from live to goal by the time the next burst
// ends, with another burst's growth to spare. The spare is measured: with
// GODEBUG=gctrace=1 at 20,000 entries, the pacer's trigger came at 70%,
// but its count of the heap ran up to a burst's allocation above objects,
// so a forecast of exactly one burst missed a third of the cycles, and
// they started inside the next burst. With the spare, 4 of 21 cycles in
// two runs did, and cycles came ~0.5 a second (0.45 before).
func gcDue(cycle, goal, live, objects uint64) bool {
	return goal > live && objects+2*cycle >= live+(goal-live)*7/10
}
