package election

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepalive renews a lease every TTL/3 and tracks, on the monotonic clock,
// when the lease could next expire at etcd. A renewal sent at t keeps the
// lease alive at etcd until at least t + TTL, whatever the reply's delay,
// so the local deadline is t + TTL - margin for the latest successful t.
type keepalive struct {
	cli    *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration
	margin time.Duration

	mu       sync.Mutex
	deadline time.Time
	timer    *time.Timer
	expiredC chan struct{}
	closed   bool
}

func newKeepalive(cli *clientv3.Client, id clientv3.LeaseID, ttl, margin time.Duration, granted time.Time) *keepalive {
	k := &keepalive{cli: cli, id: id, ttl: ttl, margin: margin, expiredC: make(chan struct{})}
	k.deadline = granted.Add(ttl - margin)
	k.timer = time.AfterFunc(time.Until(k.deadline), k.expire)
	return k
}

func (k *keepalive) expire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || time.Now().Before(k.deadline) {
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
		k.timer.Reset(time.Until(d))
	}
}

func (k *keepalive) run(ctx context.Context) {
	defer k.timer.Stop()
	interval := k.ttl / 3
	for {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, interval)
		resp, err := k.cli.KeepAliveOnce(rctx, k.id)
		cancel()
		if err == nil && resp.TTL > 0 {
			k.renewed(sent)
		}
		wait := interval - time.Since(sent)
		if err != nil {
			wait = min(wait, 200*time.Millisecond) // retry sooner on failure
		}
		select {
		case <-ctx.Done():
			return
		case <-k.expiredC:
			return
		case <-time.After(max(wait, 0)):
		}
	}
}
