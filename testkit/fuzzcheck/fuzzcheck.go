// Package fuzzcheck holds the properties every fuzz target of an input
// path asserts (issue 45): an input is handled without a panic, within
// a time and an allocation bound, and an entry it yields fires at
// strictly increasing slots no closer than the floor.
package fuzzcheck

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/beatd/beatd/schedule"
)

// TimeLimit is how long one input may take; AllocBase plus AllocPerByte
// times its length is how much it may allocate. A yaml.Node tree weighs
// about 25 bytes per byte of text and the entries built from it a few
// times that; an alias bomb refused in time stays far below both, and
// one expanded goes to gigabytes.
const (
	TimeLimit    = time.Second
	AllocBase    = 64 << 20
	AllocPerByte = 1024
)

// Bounded runs f on one input of n bytes and fails t when f panics, takes
// more than TimeLimit (scaled for the race detector, which runs code several
// times slower) or allocates more than the bound. A hang is reported at
// ten times the limit rather than waiting for the test's timeout. f runs
// on another goroutine, so it must not call t's methods: it keeps its
// results for the caller to check after.
func Bounded(t testing.TB, n int, f func()) {
	t.Helper()
	limit := TimeLimit * slowdown
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	done := make(chan struct{})
	var panicked any
	start := time.Now()
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				panicked = fmt.Sprintf("%v\n%s", r, debug.Stack())
			}
		}()
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * limit):
		t.Fatalf("an input of %d bytes still runs after %s", n, 10*limit)
	}
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if panicked != nil {
		t.Fatalf("panic: %v", panicked)
	}
	if took > limit {
		t.Errorf("an input of %d bytes took %s (limit %s)", n, took, limit)
	}
	if alloc, max := after.TotalAlloc-before.TotalAlloc, uint64(AllocBase+AllocPerByte*n); alloc > max {
		t.Errorf("an input of %d bytes allocated %d MB (limit %d MB)", n, alloc>>20, max>>20)
	}
}

// Slots fails t unless s's next few slots after a fixed time (2026-12-05
// 08:00 UTC) are each strictly
// after the one before (or none: the zero time ends them) and at least
// floor apart.
func Slots(t testing.TB, name string, s schedule.Schedule, floor time.Duration) {
	t.Helper()
	if s == nil {
		t.Fatalf("entry %q accepted without a schedule", name)
	}
	prev := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	for i := range 4 {
		next := s.Next(prev)
		if next.IsZero() {
			return
		}
		if !next.After(prev) {
			t.Fatalf("entry %q (%v): slot %d %s is not after %s", name, s, i, next.Format(time.RFC3339Nano), prev.Format(time.RFC3339Nano))
		}
		if i > 0 && next.Sub(prev) < floor {
			t.Fatalf("entry %q (%v): slots %s and %s are closer than %s", name, s, prev.Format(time.RFC3339Nano), next.Format(time.RFC3339Nano), floor)
		}
		prev = next
	}
}

// String shortens an input for a failure message.
func String(data []byte) string {
	if len(data) > 200 {
		return fmt.Sprintf("%q... (%d bytes)", data[:200], len(data))
	}
	return fmt.Sprintf("%q", data)
}
