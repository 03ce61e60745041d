package scheduler

import (
	"runtime"
	"testing"
)

func TestGCDue(t *testing.T) {
	const mb = 1 << 20
	tests := []struct {
		name                       string
		cycle, goal, live, objects uint64
		want                       bool
	}{
		// 70% of the way from 120 to 156 MB is 145.2 MB.
		{name: "fresh heap", cycle: 8 * mb, goal: 156 * mb, live: 120 * mb, objects: 121 * mb, want: false},
		{name: "next burst passes 70%", cycle: 8 * mb, goal: 156 * mb, live: 120 * mb, objects: 138 * mb, want: true},
		{name: "the one after passes 70%", cycle: 8 * mb, goal: 156 * mb, live: 120 * mb, objects: 130 * mb, want: true},
		{name: "short of 70% by more than two bursts", cycle: 8 * mb, goal: 156 * mb, live: 120 * mb, objects: 129 * mb, want: false},
		{name: "small cycle waits", cycle: 1 * mb, goal: 156 * mb, live: 120 * mb, objects: 138 * mb, want: false},
		{name: "no goal yet", cycle: 8 * mb, goal: 0, live: 0, objects: 10 * mb, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := gcDue(tt.cycle, tt.goal, tt.live, tt.objects); got != tt.want {
				t.Errorf("gcDue(%d, %d, %d, %d) = %v, want %v", tt.cycle/mb, tt.goal/mb, tt.live/mb, tt.objects/mb, got, tt.want)
			}
		})
	}
}

// TestGCGapDue walks end's decision through bursts: the first only marks
// where the next starts, and a burst after which a cycle already ran
// (unswept garbage still inflating objects) forces none.
func TestGCGapDue(t *testing.T) {
	const mb = 1 << 20
	steps := []struct {
		name string
		h    heapStats
		want bool
	}{
		{"first burst", heapStats{allocs: 100 * mb, goal: 156 * mb, live: 120 * mb, objects: 140 * mb, cycles: 7}, false},
		{"heap far from the trigger", heapStats{allocs: 108 * mb, goal: 156 * mb, live: 120 * mb, objects: 125 * mb, cycles: 7}, false},
		{"within two bursts of it", heapStats{allocs: 116 * mb, goal: 156 * mb, live: 120 * mb, objects: 133 * mb, cycles: 7}, true},
		{"the forced cycle ran", heapStats{allocs: 124 * mb, goal: 158 * mb, live: 121 * mb, objects: 150 * mb, cycles: 8}, false},
		{"fresh heap", heapStats{allocs: 132 * mb, goal: 158 * mb, live: 121 * mb, objects: 129 * mb, cycles: 8}, false},
		{"the pacer's cycle ran in the burst", heapStats{allocs: 140 * mb, goal: 158 * mb, live: 121 * mb, objects: 156 * mb, cycles: 9}, false},
	}
	var g gcGap
	for _, s := range steps {
		if got := g.due(s.h); got != s.want {
			t.Errorf("%s: due = %v, want %v", s.name, got, s.want)
		}
	}
}

// TestGCGapReadsTheRuntime: the runtime serves every metric gcGap reads,
// as the kind it expects (a renamed one would read as 0 and disable it).
func TestGCGapReadsTheRuntime(t *testing.T) {
	var g gcGap
	runtime.GC() // at least one cycle to count
	h := g.read()
	if h.allocs == 0 || h.goal == 0 || h.objects == 0 || h.cycles == 0 {
		t.Fatalf("read %+v: want all but live non-zero", h)
	}
}
