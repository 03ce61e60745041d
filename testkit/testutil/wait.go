package testutil

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
)

// Eventually polls cond every millisecond until it holds, and fails the
// test naming what it waited for if timeout passes first. It is how a
// test waits for something nothing can tell it about.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	EventuallyEvery(tb, timeout, time.Millisecond, what, cond)
}

// EventuallyEvery is Eventually with a poll interval, for conditions that
// cost a round trip to a server or a process, or that move a fake clock.
func EventuallyEvery(tb testing.TB, timeout, every time.Duration, what string, cond func() bool) {
	tb.Helper()
	EventuallyErr(tb, timeout, every, what, func() error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	})
}

// EventuallyErr polls cond every interval until it returns nil, and fails
// the test with cond's last error if timeout passes first.
func EventuallyErr(tb testing.TB, timeout, every time.Duration, what string, cond func() error) {
	tb.Helper()
	if err := harness.Poll(context.Background(), timeout, every, cond); err != nil {
		tb.Fatalf("waiting for %s: %v", what, err)
	}
}
