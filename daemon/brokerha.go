package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/prometheus/client_golang/prometheus"
)

// brokerProbeEvery is how often every replica probes the broker on its own
// path; brokerProbeTimeout bounds one probe.
const (
	brokerProbeEvery   = 500 * time.Millisecond
	brokerProbeTimeout = time.Second
	// brokerConfirmTimeout bounds the leader's last ping before it hands
	// over for a cut path.
	brokerConfirmTimeout = 500 * time.Millisecond
)

// brokerHealth is this replica's view of its own path to the broker.
type brokerHealth struct {
	mu        sync.Mutex
	err       error     // the last probe's failure, nil when it passed
	downSince time.Time // when the probes began to fail in a row
	probed    bool
	checkedAt time.Time // when the last probe ended
	handovers *prometheus.CounterVec
	// holdUntil keeps a replica that handed over out of the election.
	holdUntil time.Time
}

// Err is the last probe's failure (nil before the first probe).
func (b *brokerHealth) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *brokerHealth) since() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.downSince
}

// brokerCheck is whether the broker answers this replica, for readiness,
// the dependency log and the console: the probe's result while it is
// fresh, so they do not ping the broker again on top of it, else a ping.
func (m *Main) brokerCheck(ctx context.Context) error {
	b := &m.brokerHA
	b.mu.Lock()
	fresh := b.probed && m.clock.Since(b.checkedAt) <= 2*brokerProbeEvery
	err := b.err
	b.mu.Unlock()
	if fresh {
		return err
	}
	return m.brokerPing(ctx)
}

// watchBroker probes the broker every brokerProbeEvery until ctx ends.
// The registry publishes the result, so the leader knows which standbys
// reach the broker, and the leader's watchdog reads how long its own
// path has failed.
func (m *Main) watchBroker(ctx context.Context) {
	t := m.clock.NewTicker(brokerProbeEvery)
	defer t.Stop()
	for {
		// A failing probe dates the failure from its start: the path was
		// already cut when the probe began and waited out its timeout.
		began := m.clock.Now()
		pctx, cancel := context.WithTimeout(ctx, brokerProbeTimeout)
		err := m.brokerPing(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		b := &m.brokerHA
		b.mu.Lock()
		switch {
		case err == nil:
			b.downSince = time.Time{}
		case b.err == nil || !b.probed:
			b.downSince = began
		}
		b.err, b.probed, b.checkedAt = err, true, m.clock.Now()
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}

// failoverAfter is --broker-failover-after, or its default: twice the
// lease TTL.
func (m *Main) failoverAfter() time.Duration {
	if m.BrokerFailoverAfter > 0 {
		return m.BrokerFailoverAfter
	}
	return 2 * m.LeaseTTL
}

// holdAfterHandover is how long a replica that handed over stays out of
// the election: long enough that it does not take leadership straight
// back while its own path is still cut.
func (m *Main) holdAfterHandover() time.Duration { return 2 * m.failoverAfter() }

// electionHold is leader.Config.Hold.
func (m *Main) electionHold() time.Duration {
	b := &m.brokerHA
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.holdUntil.Sub(m.clock.Now()), 0)
}

// brokerWatchdog runs beside a term: when this leader's path to the broker
// has failed (its publishes, or its own probes) for failoverAfter, and a
// standby's fresh registration says it reaches the broker, it resigns at
// once, so a standby leads, and ends the term (endTerm). It resigns
// before the term's work has stopped because a publish stuck on the cut
// path may take its read timeout to give up; the new leader's fence
// refuses whatever it still sends. A broker that
// every replica sees down is an outage, not a path: the leader stays, and
// its slots stay pending as before.
func (m *Main) brokerWatchdog(ctx context.Context, resign func(context.Context) error, endTerm func(error)) {
	m.watchBrokerPath(ctx, brokerPath{
		leading:      func() bool { return true },
		failingSince: m.sched.PublishFailingSince,
		publishErr:   m.sched.PublishError,
		handOver: func(ctx context.Context, standby string) bool {
			if resign != nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				if err := resign(rctx); err != nil {
					m.log.Warn("resign for the handover failed; the term ends anyway", "err", err)
				}
				cancel()
			}
			endTerm(fmt.Errorf("%w (standby %s reaches it)", errBrokerHandover, standby))
			return true
		},
	})
}

// brokerPath is what a broker watchdog watches, and how it hands over:
// an unsharded leader's term, or a sharded replica's shards.
type brokerPath struct {
	// leading says whether there is anything to hand over now.
	leading func() bool
	// failingSince is since when the publishes have failed (zero: they
	// do not), and publishErr their last error.
	failingSince func() time.Time
	publishErr   func() error
	// handOver hands leadership to the replicas that reach the broker
	// (standby is one); true ends the watchdog.
	handOver func(ctx context.Context, standby string) (done bool)
}

// shardBrokerWatchdog is a sharded replica's brokerWatchdog, for its
// lifetime: when its path to the broker has failed for failoverAfter and
// another replica reaches the broker, it resigns every shard it leads and
// stays out of every shard's election for holdAfterHandover (the shard
// set's hold), so the replicas that reach the broker lead them.
func (m *Main) shardBrokerWatchdog(ctx context.Context) {
	m.watchBrokerPath(ctx, brokerPath{
		leading:      func() bool { return m.shards.held() > 0 },
		failingSince: m.shards.publishFailingSince,
		publishErr:   m.shards.publishError,
		handOver: func(ctx context.Context, _ string) bool {
			m.shards.handOverAll(ctx)
			return false
		},
	})
}

// watchBrokerPath is the watchdog of brokerWatchdog, over w.
func (m *Main) watchBrokerPath(ctx context.Context, w brokerPath) {
	t := m.clock.NewTicker(brokerProbeEvery)
	defer t.Stop()
	after := m.failoverAfter()
	var spared time.Time // the failures a passing ping last spared
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if !w.leading() {
			continue
		}
		now := m.clock.Now()
		since := m.brokerHA.since()
		if p := w.failingSince(); !p.IsZero() && (since.IsZero() || p.Before(since)) {
			since = p
		}
		if since.IsZero() || now.Sub(since) < after {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		reps, err := election.Replicas(rctx, m.etcd, m.Etcd.KeyPrefix())
		cancel()
		if err != nil {
			continue
		}
		var healthy string
		for _, r := range reps {
			// A registration is rewritten at least every 5 s; an older one
			// is a replica that is gone or cut from etcd.
			if r.ID != m.ID && r.Broker == "ok" && now.Sub(r.Updated) < 10*time.Second {
				healthy = r.ID
				break
			}
		}
		if healthy == "" {
			continue
		}
		// The standby's "ok" may be newer than this replica's last failure:
		// when a broker outage ends, a standby can probe it healthy before
		// this replica's failures have aged out, and handing over then
		// would turn the end of an outage into a needless failover. So the
		// path is tried once more, after the standby's report was read. A
		// short timeout is enough: one that expires only hands over, as the
		// failures already said to.
		pctx, cancel := context.WithTimeout(ctx, brokerConfirmTimeout)
		err = m.brokerPing(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			// Until a publish succeeds the failures stay dated, and this
			// ping repeats at each tick: the line is logged once.
			if !since.Equal(spared) {
				spared = since
				m.log.Info("not handing over: the broker answers this replica again", "standby", healthy, "failing_for", now.Sub(since).Round(100*time.Millisecond).String())
			}
			continue
		}
		why := m.brokerHA.Err()
		if why == nil {
			why = w.publishErr()
		}
		m.brokerHA.mu.Lock()
		m.brokerHA.holdUntil = now.Add(m.holdAfterHandover())
		m.brokerHA.mu.Unlock()
		m.brokerHA.handovers.WithLabelValues("broker_unreachable").Inc()
		m.log.Warn("handing leadership over: this replica has not reached the broker for "+now.Sub(since).Round(100*time.Millisecond).String()+
			", and a standby does", "standby", healthy, "failover_after", after.String(), "hold", m.holdAfterHandover().String(), "err", why)
		if w.handOver(ctx, healthy) {
			return
		}
	}
}

// errBrokerHandover ends a term whose leader cannot reach the broker.
var errBrokerHandover = errors.New("handed over: the broker is unreachable from this replica")
