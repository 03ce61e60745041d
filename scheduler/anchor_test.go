package scheduler

import (
	"strings"
	"testing"
	"time"
)

// An interval without start_at or relative is anchored where its schedule
// began (Since, rounded down to the second), and a later term, reading Since
// (or, once it fired, its last slot) from the store, keeps that grid; a
// changed interval re-anchors.
func TestIntervalAnchoredAtSince(t *testing.T) {
	start := t0.Add(3400 * time.Millisecond)
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s}\n", start)
	h.start(7)
	h.settle()
	for i := 0; i < 2; i++ {
		h.clock.Advance(10 * time.Second)
		h.settle()
	}
	got := h.waitPublished(2)
	if want := slots("e", "2026-11-30T10:00:13Z", "2026-11-30T10:00:23Z"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("first term published %v, want %v (grid anchored at 10:00:03)", got, want)
	}
	h.cancel()
	if err := <-h.done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	h.done <- nil

	// A new leader at 10:00:40 owes 10:00:33 (catch-up once) and then
	// continues on the same grid.
	h2 := newHarness(t, "entries:\n  e: {task: t, every: 10s}\n", t0.Add(40*time.Second))
	h2.store = h.store
	h2.store.mu.Lock()
	h2.store.token = 8
	h2.store.mu.Unlock()
	h2.sched.cfg.Store = h2.store
	h2.start(8)
	h2.settle()
	h2.clock.Advance(5 * time.Second)
	h2.settle()
	got = h2.waitPublished(2)
	if want := slots("e", "2026-11-30T10:00:33Z", "2026-11-30T10:00:43Z"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("second term published %v, want %v", got, want)
	}

	// Changing the interval re-anchors at the time of the change.
	if err := h2.sched.Reload(mustConfig(t, "entries:\n  e: {task: t, every: 7s}\n")); err != nil {
		t.Fatal(err)
	}
	h2.settle()
	h2.clock.Advance(1500 * time.Millisecond) // 10:00:46.5; the reload was applied at 10:00:45
	h2.settle()
	h2.clock.Advance(7 * time.Second)
	h2.settle()
	got = h2.waitPublished(3)
	if want := "e 2026-11-30T10:00:52Z"; got[2] != want {
		t.Fatalf("after the change published %v, want %s third (anchored at the reload, 10:00:45)", got, want)
	}
}

// relative: true keeps the clock-aligned grid; start_at wins over Since.
func TestIntervalRelativeAndStartAt(t *testing.T) {
	h := newHarness(t, "entries:\n  r: {task: t, every: 10s, relative: true}\n  s: {task: t, every: 10s, start_at: 2026-11-30T09:00:07Z}\n", t0.Add(3400*time.Millisecond))
	h.start(7)
	h.settle()
	h.clock.Advance(10 * time.Second)
	h.settle()
	got := h.waitPublished(2)
	want := []string{"s 2026-11-30T10:00:07Z", "r 2026-11-30T10:00:10Z"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("published %v, want %v", got, want)
	}
}

// A solar entry fires at its event, a whole-second slot.
func TestSolarEntryFires(t *testing.T) {
	h := newHarness(t, "entries:\n  rise: {task: t, solar: {event: sunrise, lat: 52.52, lon: 13.40}}\n", t0)
	want := h.sched.Config().Entry("rise").Schedule.Next(t0)
	h.start(7)
	h.settle()
	h.clock.Advance(want.Sub(t0))
	h.settle()
	got := h.waitPublished(1)
	if exp := "rise " + want.UTC().Format(time.RFC3339); strings.Join(got, ",") != exp {
		t.Fatalf("published %v, want %s", got, exp)
	}
}
