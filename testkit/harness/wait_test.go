package harness

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	calls := 0
	if err := Poll(context.Background(), time.Second, time.Millisecond, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || calls != 3 {
		t.Fatalf("Poll = %v after %d calls, want nil after 3", err, calls)
	}

	// A zero timeout still checks once, and reports cond's error.
	calls = 0
	errLast := errors.New("last")
	if err := Poll(context.Background(), 0, time.Millisecond, func() error { calls++; return errLast }); !errors.Is(err, errLast) || calls != 1 {
		t.Fatalf("Poll(0) = %v after %d calls, want %v after 1", err, calls, errLast)
	}

	// ErrGaveUp ends the wait at once.
	calls = 0
	err := Poll(context.Background(), time.Hour, time.Millisecond, func() error {
		calls++
		return fmt.Errorf("exited: %w", ErrGaveUp)
	})
	if !errors.Is(err, ErrGaveUp) || calls != 1 {
		t.Fatalf("Poll = %v after %d calls, want ErrGaveUp after 1", err, calls)
	}

	// So does the context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Poll(ctx, time.Hour, time.Millisecond, func() error { return errLast }); !errors.Is(err, context.Canceled) || !errors.Is(err, errLast) {
		t.Fatalf("Poll with a cancelled context = %v", err)
	}
}
