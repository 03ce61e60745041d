package election

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// fakeRenewer answers renewals as told, on the fake clock: ok or not, and
// after a delay (a slow etcd) measured on that clock.
type fakeRenewer struct {
	clock  *clockwork.FakeClock
	mu     sync.Mutex
	ok     bool
	delay  time.Duration
	calls  int
	lastOK time.Time // when the last successful renewal was sent
}

func (r *fakeRenewer) set(ok bool, delay time.Duration) {
	r.mu.Lock()
	r.ok, r.delay = ok, delay
	r.mu.Unlock()
}

func (r *fakeRenewer) renew(ctx context.Context) (int64, error) {
	r.mu.Lock()
	ok, delay := r.ok, r.delay
	r.calls++
	sent := r.clock.Now()
	r.mu.Unlock()
	if delay > 0 {
		select {
		case <-r.clock.After(delay):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if !ok {
		return 0, errors.New("etcd unreachable")
	}
	r.mu.Lock()
	r.lastOK = sent
	r.mu.Unlock()
	return 5, nil
}

// TestKeepaliveStepDown drives the keepalive on the fake clock: while
// renewals succeed it never expires; once they fail it expires exactly
// TTL - margin after the last renewal was sent, however late its reply
// came; and never before.
func TestKeepaliveStepDown(t *testing.T) {
	const ttl, margin = 3 * time.Second, 600 * time.Millisecond
	for _, tc := range []struct {
		name  string
		delay time.Duration // the successful renewals' reply delay
	}{
		{"prompt replies", 0},
		{"slow replies", 700 * time.Millisecond}, // the deadline counts from the send
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
			clock := clockwork.NewFakeClockAt(start)
			r := &fakeRenewer{clock: clock, ok: true, delay: tc.delay}
			k := newKeepalive(r.renew, clock, ttl, margin, clock.Now())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { defer close(done); k.run(ctx) }()
			// Ten renewal intervals with etcd answering: alive throughout.
			step := func(d time.Duration) {
				t.Helper()
				// The run loop and the expiry timer are both armed: wait for
				// them, so no step races the goroutine.
				if err := clock.BlockUntilContext(ctx, 2); err != nil {
					t.Fatal(err)
				}
				clock.Advance(d)
			}
			for range 10 {
				if tc.delay > 0 {
					step(tc.delay) // the reply arrives
				}
				step(ttl/3 - tc.delay)
				if k.isExpired() {
					t.Fatalf("expired at %s while etcd answered", clock.Since(start))
				}
			}
			// etcd stops answering: the step-down comes TTL - margin after
			// the last good renewal was sent, however late its reply was.
			r.set(false, 0)
			if err := clock.BlockUntilContext(ctx, 2); err != nil {
				t.Fatal(err)
			}
			r.mu.Lock()
			want := r.lastOK.Add(ttl - margin)
			r.mu.Unlock()
			if got := k.deadlineForTest(); !got.Equal(want) {
				t.Fatalf("deadline %s after start, want %s (last good send + TTL - margin)", got.Sub(start), want.Sub(start))
			}
			for clock.Now().Add(retryAfterFailure).Before(want) {
				step(retryAfterFailure)
				if k.isExpired() {
					t.Fatalf("expired %s before the deadline", want.Sub(clock.Now()))
				}
			}
			clock.Advance(want.Sub(clock.Now()))
			select {
			case <-k.expired():
			case <-time.After(5 * time.Second):
				t.Fatal("not expired at the deadline")
			}
			<-done // the loop stops with it
		})
	}
}

func (k *keepalive) deadlineForTest() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline
}
