package scheduler

import "testing"

func TestGCDue(t *testing.T) {
	const mb = 1 << 20
	tests := []struct {
		name                       string
		cycle, goal, live, objects uint64
		want                       bool
	}{
		{name: "fresh heap", cycle: 8 * mb, goal: 156 * mb, live: 120 * mb, objects: 121 * mb, want: false},
		{name: "next burst passes 70%", cycle: 8 * mb, goal: 156 * mb, live: 120 * mb, objects: 138 * mb, want: true},
		{name: "just short of 70%", cycle: 8 * mb, goal: 156 * mb, live: 120 * mb, objects: 137*mb - 1, want: false},
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

// TestGCGapReadsTheRuntime: the runtime serves every metric gcGap reads,
// as the kind it expects (a renamed one would read as 0 and disable it).
func TestGCGapReadsTheRuntime(t *testing.T) {
	var g gcGap
	allocs, goal, live, objects := g.read()
	if allocs == 0 || goal == 0 || objects == 0 {
		t.Fatalf("read allocs %d, goal %d, live %d, objects %d: want all but live non-zero", allocs, goal, live, objects)
	}
}
