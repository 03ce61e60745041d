package testutil

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/harness"
)

// Eventually polls cond every millisecond until it holds, and fails the
// test naming what it waited for if timeout passes first. It is the one
// way a test waits for something it cannot be told about.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	EventuallyEvery(tb, timeout, time.Millisecond, what, cond)
}

// EventuallyEvery is Eventually with a poll interval, for conditions that
// cost a round trip to a server or a process.
func EventuallyEvery(tb testing.TB, timeout, every time.Duration, what string, cond func() bool) {
	tb.Helper()
	err := harness.Poll(context.Background(), timeout, every, func() error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	})
	if err != nil {
		tb.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}
