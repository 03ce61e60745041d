package election

import (
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepalive renews a lease every TTL/3 and tracks, on the clock (the real
// one reads the monotonic clock), when the lease could next expire at
// etcd. A renewal sent at t keeps the lease alive at etcd until at least
// t + TTL, whatever the reply's delay, so the local deadline is
// t + TTL - margin for the latest successful t. It is the safety-critical
// step-down: it runs on the injected clock so its tests can drive it.
type keepalive struct {
	renew  func(ctx context.Context) (ttl int64, err error)
	clock  clockwork.Clock
	ttl    time.Duration
	margin time.Duration

	mu       sync.Mutex
	deadline time.Time
	timer    clockwork.Timer
	expiredC chan struct{}
	closed   bool
}

// leaseRenewer renews lease id on cli, once per call.
func leaseRenewer(cli *clientv3.Client, id clientv3.LeaseID) func(ctx context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		resp, err := cli.KeepAliveOnce(ctx, id)
		if err != nil {
			return 0, err
		}
		return resp.TTL, nil
	}
}

func newKeepalive(renew func(context.Context) (int64, error), clock clockwork.Clock, ttl, margin time.Duration, granted time.Time) *keepalive {
	k := &keepalive{renew: renew, clock: clock, ttl: ttl, margin: margin, expiredC: make(chan struct{})}
	k.deadline = granted.Add(ttl - margin)
	k.timer = clock.AfterFunc(k.deadline.Sub(clock.Now()), k.expire)
	return k
}

func (k *keepalive) expire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || k.clock.Now().Before(k.deadline) {
		return
	}
	k.closed = true
	close(k.expiredC)
}

func (k *keepalive) expired() <-chan struct{} { return k.expiredC }

func (k *keepalive) isExpired() bool {
	select {
	case <-k.expiredC:
		return true
	default:
		return false
	}
}

// renewed records a renewal sent at sent.
func (k *keepalive) renewed(sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	if d := sent.Add(k.ttl - k.margin); d.After(k.deadline) {
		k.deadline = d
		k.timer.Reset(d.Sub(k.clock.Now()))
	}
}

// retryAfterFailure is how soon a failed renewal is retried.
const retryAfterFailure = 200 * time.Millisecond

func (k *keepalive) run(ctx context.Context) {
	defer k.timer.Stop()
	interval := k.ttl / 3
	for {
		sent := k.clock.Now()
		rctx, cancel := context.WithTimeout(ctx, interval)
		ttl, err := k.renew(rctx)
		cancel()
		if err == nil && ttl > 0 {
			k.renewed(sent)
		}
		wait := interval - k.clock.Since(sent)
		if err != nil || ttl <= 0 {
			wait = min(wait, retryAfterFailure)
		}
		t := k.clock.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-k.expiredC:
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}
