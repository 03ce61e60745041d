package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"
)

// Clock reads the time and makes timers, so tests can drive the loop
// deterministically.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the loop uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration)
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer returns a real timer.
func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Stop() bool            { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }

// FakeClock is a manual clock for tests: time moves only on Advance or Set.
type FakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced whenever a timer is armed, fired or stopped
}

// NewFakeClock returns a clock stopped at now.
func NewFakeClock(now time.Time) *FakeClock {
	return &FakeClock{now: now, changed: make(chan struct{})}
}

// BlockUntil waits until at least n timers are armed. A goroutine that
// arms a timer and waits on it is idle until the clock moves, so tests
// wait for that instead of sleeping and hoping.
func (f *FakeClock) BlockUntil(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		armed := 0
		for _, t := range f.timers {
			if t.active {
				armed++
			}
		}
		ch := f.changed
		f.mu.Unlock()
		if armed >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("scheduler: %d of %d timers armed: %w", armed, n, ctx.Err())
		}
	}
}

// Changed is closed at the next change to the timers (armed, fired or
// stopped).
func (f *FakeClock) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// notifyLocked wakes BlockUntil.
func (f *FakeClock) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Now returns the fake time.
func (f *FakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches its
// deadline.
func (f *FakeClock) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{clock: f, c: make(chan time.Time, 1), at: f.now.Add(d), active: true}
	f.timers = append(f.timers, t)
	f.fireLocked()
	f.notifyLocked()
	return t
}

// Advance moves time forward and fires due timers.
func (f *FakeClock) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Set moves time to t and fires due timers.
func (f *FakeClock) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
	f.fireLocked()
	f.notifyLocked()
}

// NextDeadline returns the earliest active timer deadline, if any.
func (f *FakeClock) NextDeadline() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var active []*fakeTimer
	for _, t := range f.timers {
		if t.active {
			active = append(active, t)
		}
	}
	if len(active) == 0 {
		return time.Time{}, false
	}
	sort.Slice(active, func(i, j int) bool { return active[i].at.Before(active[j].at) })
	return active[0].at, true
}

func (f *FakeClock) fireLocked() {
	kept := f.timers[:0]
	for _, t := range f.timers {
		if t.active && !t.at.After(f.now) {
			t.active = false
			select {
			case t.c <- f.now:
			default:
			}
		}
		if t.active {
			kept = append(kept, t)
		}
	}
	f.timers = kept
}

type fakeTimer struct {
	clock  *FakeClock
	c      chan time.Time
	at     time.Time
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	was := t.active
	t.active = false
	t.clock.notifyLocked()
	return was
}

func (t *fakeTimer) Reset(d time.Duration) {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	t.at = t.clock.now.Add(d)
	if !t.active {
		t.active = true
		// A stopped timer stays in the list until the next firing
		// prunes it: add it back only if it is gone, or it would count
		// twice.
		if !slices.Contains(t.clock.timers, t) {
			t.clock.timers = append(t.clock.timers, t)
		}
	}
	t.clock.fireLocked()
	t.clock.notifyLocked()
}
