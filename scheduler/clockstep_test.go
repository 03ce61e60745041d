package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestClockSteps states the policy for wall-clock steps, on the injected
// clock. Forward (NTP, a VM resumed): the slots in between go through each
// entry's catch-up policy, as after a failover. Backward: no slot fires
// twice, and the next slots fire when the clock passes them again.
func TestClockSteps(t *testing.T) {
	for _, step := range []time.Duration{2 * time.Minute, 2 * time.Hour} {
		t.Run(fmt.Sprint("forward ", step), func(t *testing.T) {
			h := newHarness(t, `entries:
  once: {task: t, cron: '* * * * *', catchup: once}
  all:  {task: t, cron: '* * * * *', catchup: all, catchup_window: 3h, max_catchup: 500}
  skip: {task: t, cron: '* * * * *', catchup: skip}
`, t0.Add(30*time.Second))
			h.start(7)
			h.settle()
			setClock(h.clock, t0.Add(time.Minute))
			h.waitPublished(3)
			h.settle()
			before := len(h.disp.list())
			now := t0.Add(time.Minute + step)
			setClock(h.clock, now)
			missed := int(step / time.Minute) // slots after 10:01 up to now
			want := before + 1 + missed       // once: the latest; all: each; skip: none
			h.waitPublished(want)
			h.settle()
			got := h.disp.list()[before:]
			count := map[string]int{}
			for _, f := range got {
				count[strings.Fields(f)[0]]++
			}
			if count["once"] != 1 || count["all"] != missed || count["skip"] != 0 {
				t.Errorf("after a step of %s: once %d (want 1), all %d (want %d), skip %d (want 0)", step, count["once"], count["all"], missed, count["skip"])
			}
			// Then regular slots again.
			next := now.Truncate(time.Minute).Add(time.Minute)
			setClock(h.clock, next)
			h.waitPublished(want + 3)
			for _, name := range []string{"once", "all", "skip"} {
				if !contains(h.disp.list(), name+" "+next.UTC().Format(time.RFC3339)) {
					t.Errorf("%s did not fire its regular slot %s after the step", name, next.Format(time.RFC3339))
				}
			}
		})
	}
	for _, step := range []time.Duration{time.Minute, 2 * time.Hour} {
		t.Run(fmt.Sprint("backward ", step), func(t *testing.T) {
			h := newHarness(t, "entries:\n  m: {task: t, cron: '* * * * *', catchup: all}\n", t0.Add(30*time.Second))
			h.start(7)
			h.settle()
			for i := 1; i <= 3; i++ {
				setClock(h.clock, t0.Add(time.Duration(i)*time.Minute))
				h.waitPublished(i)
				h.settle()
			}
			last := t0.Add(3 * time.Minute)
			h.clock.Advance(-step) // the wall clock steps back
			h.settle()
			// Walk the clock forward again past where it was: nothing fires
			// twice, nothing fires before the clock passes 10:04.
			for at := last.Add(-step).Add(30 * time.Second); !at.After(last.Add(2 * time.Minute)); at = at.Add(30 * time.Second) {
				setClock(h.clock, at)
				h.settle()
				if n := len(h.disp.list()); at.Before(last.Add(time.Minute)) && n != 3 {
					t.Fatalf("at %s (stepped back %s) %d fires, want 3: %v", at.Format(time.RFC3339), step, n, h.disp.list())
				}
			}
			got := h.disp.list()
			seen := map[string]bool{}
			for _, f := range got {
				if seen[f] {
					t.Errorf("%s fired twice", f)
				}
				seen[f] = true
			}
			for _, want := range []string{"m 2026-11-30T10:04:00Z", "m 2026-11-30T10:05:00Z"} {
				if !seen[want] {
					t.Errorf("%s did not fire once the clock passed it again: %v", want, got)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
