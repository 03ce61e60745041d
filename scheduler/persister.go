package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
)

// persister writes entry state behind the loop, so etcd never delays a
// publish. The loop hands it the latest state of each entry that changed
// (a map bounded by the number of entries, never a queue that can fill
// up); it writes what changed at most once per interval, packed into
// buckets. Losing a write it had not made yet is safe: the next leader
// re-publishes those slots and the broker's dedup (Redis: each entry's
// high-water mark, which never expires) makes that a no-op. While etcd
// refuses writes (unreachable, NOSPACE) the loop keeps firing and the
// backlog only grows in place; where the broker's dedup has a horizon
// (Config.DedupTTL > 0), a backlog past it could duplicate on failover,
// which it says loudly.
type persister struct {
	store    StateStore
	guard    election.Fence
	log      *slog.Logger
	m        *Metrics
	clock    clockwork.Clock
	interval time.Duration
	dedupTTL time.Duration

	errc chan struct{} // closed when the term's writes are refused
	kick chan struct{} // write now: a request completed, or a flush

	mu      sync.Mutex
	err     error
	pending map[string]pendingState // changed since handed to the table
	spare   map[string]pendingState // the last write's pending, cleared, for the next swap
	reqs    []string                // completed requests' keys to delete
	since   time.Time               // oldest change in pending
	gen     uint64                  // bumped by every change
	wrote   uint64                  // gen that the last successful write covered
	tried   uint64                  // gen that the last failed write covered
	written chan struct{}           // closed and replaced after every write attempt
	failing error                   // the last write's error, nil once one succeeds

	// Owned by run's goroutine.
	table      *store.Table
	tableSince time.Time // oldest change in the table not yet written

	inFlight map[string]bool // admin requests being handled (loop-owned)
}

type pendingState struct {
	st      store.EntryState
	deleted bool
}

// spareMax is the largest pending map kept for the next interval.
const spareMax = 1 << 16

// writeAttemptTimeout bounds one write, so a request stuck on a dead
// etcd member does not hold up the next attempt or a shutdown.
const writeAttemptTimeout = 2 * time.Second

// failLogEvery spaces the ERROR lines while writes fail.
const failLogEvery = time.Minute

// dedupMargin is how far below the broker's dedup horizon the backlog's
// age counts as dangerous: a failover then re-publishes slots the broker
// no longer remembers.
const dedupMargin = time.Hour

func newPersister(s StateStore, g election.Fence, t *store.Table, c Config) *persister {
	p := &persister{store: s, guard: g, table: t, log: c.Logger, m: c.Metrics, clock: c.Clock,
		interval: c.StateInterval, dedupTTL: c.DedupTTL,
		errc: make(chan struct{}), kick: make(chan struct{}, 1), written: make(chan struct{}),
		pending: map[string]pendingState{}, inFlight: map[string]bool{}}
	if t.Dirty() > 0 {
		// Changed before it was handed over (pruning, first baselines):
		// unwritten, and a flush must wait for it.
		p.tableSince, p.gen = c.Clock.Now(), 1
		// Written at once, not at the first tick: a first start's
		// baselines are what make a next leader owe the new entries'
		// first slots, and the interval may be long.
		p.poke()
	}
	return p
}

func (p *persister) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *persister) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
		close(p.errc)
	}
}

// writeError is the last write's error, nil once writing works.
func (p *persister) writeError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failing
}

// save records the entries' latest state. It never blocks on etcd.
func (p *persister) save(states ...store.EntryState) {
	if len(states) == 0 {
		return
	}
	now := p.clock.Now()
	p.mu.Lock()
	for _, st := range states {
		p.pending[st.Name] = pendingState{st: st.Clone()}
	}
	p.changedLocked(now)
	p.mu.Unlock()
}

// saveNow is save for a change a next leader must see to act right (a
// new entry's baseline, the end of a run that frees an overlap or makes a
// pause): it is written at once, not
// at the next tick. Progress alone (the last slot published) can wait,
// since the broker's marks cover it.
func (p *persister) saveNow(states ...store.EntryState) {
	p.save(states...)
	p.poke()
}

// remove deletes the entries' state.
func (p *persister) remove(names ...string) {
	if len(names) == 0 {
		return
	}
	now := p.clock.Now()
	p.mu.Lock()
	for _, n := range names {
		p.pending[n] = pendingState{st: store.EntryState{Name: n}, deleted: true}
	}
	p.changedLocked(now)
	p.mu.Unlock()
}

func (p *persister) changedLocked(now time.Time) {
	if p.since.IsZero() {
		p.since = now
	}
	p.gen++
}

// complete records an admin request's effect (st may be nil) and deletes
// the request in the same write, which it makes at once.
func (p *persister) complete(r store.Request, st *store.EntryState) {
	p.inFlight[r.ID] = true
	if st != nil {
		p.save(*st)
	}
	p.mu.Lock()
	p.reqs = append(p.reqs, r.Key)
	p.changedLocked(p.clock.Now())
	p.mu.Unlock()
	p.poke()
}

func (p *persister) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *persister) markSeen(id string)  { p.inFlight[id] = true }
func (p *persister) seen(id string) bool { return p.inFlight[id] }

// flush writes everything changed so far and waits for it, until ctx
// ends; with once, only until the first attempt that covered it fails
// (a batch's write then gives way to the next batch, and the run loop
// retries it with backoff).
func (p *persister) flush(ctx context.Context, once bool) error {
	p.mu.Lock()
	gen := p.gen
	p.mu.Unlock()
	for {
		p.mu.Lock()
		done, gaveUp, ch, ended, failing := p.wrote >= gen, once && p.tried >= gen, p.written, p.err, p.failing
		p.mu.Unlock()
		switch {
		case ended != nil:
			return ended
		case done:
			return nil
		case gaveUp:
			return fmt.Errorf("scheduler: flush state: %w", failing)
		}
		p.poke()
		select {
		case <-ch:
		case <-ctx.Done():
			if failing != nil {
				return fmt.Errorf("scheduler: flush state: %w (last write: %w)", ctx.Err(), failing)
			}
			return fmt.Errorf("scheduler: flush state: %w", ctx.Err())
		}
	}
}

// run writes until ctx ends or leadership is lost.
func (p *persister) run(ctx context.Context) {
	var (
		retryAt time.Time
		lastLog time.Time
		// Back off while etcd refuses, so a struggling etcd is not
		// hammered; the backlog only grows in place meanwhile.
		b = retry.Backoff(p.interval, max(p.interval, min(10*p.interval, 10*time.Second)))
	)
	tick := p.clock.NewTimer(p.interval)
	defer tick.Stop()
	defer p.m.StatePersistFailing.Set(0)
	defer p.m.StateUnpersistedAge.Set(0)
	for {
		kicked := false
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
			tick.Reset(p.interval)
		case <-p.kick:
			kicked = true
		}
		now := p.clock.Now()
		if !kicked && now.Before(retryAt) {
			p.report(now, &lastLog)
			continue
		}
		err := p.write(ctx)
		if errors.Is(err, store.ErrNotLeader) {
			p.fail(fmt.Errorf("%w: %w", ErrTermEnded, err))
			return
		}
		if err != nil {
			p.m.EtcdErrors.Inc()
			retryAt = now.Add(b.NextBackOff())
		} else {
			b.Reset()
			retryAt = time.Time{}
		}
		p.report(now, &lastLog)
	}
}

// write hands the pending changes to the table and writes its dirty
// buckets and completed requests.
func (p *persister) write(ctx context.Context) error {
	p.mu.Lock()
	pending, reqs, since, gen := p.pending, p.reqs, p.since, p.gen
	if len(pending) > 0 {
		// The last write's map, cleared, keeps its room: with 20k entries
		// every second, growing a new one each interval was a fifth of
		// the leader's allocations.
		p.pending, p.spare = p.spare, nil
		if p.pending == nil {
			p.pending = map[string]pendingState{}
		}
	} else {
		pending = nil // the loop keeps adding to the map it still holds
	}
	p.reqs, p.since = nil, time.Time{}
	p.mu.Unlock()

	for _, ps := range pending {
		if ps.deleted {
			p.table.Delete(ps.st.Name)
		} else {
			p.table.Set(ps.st)
		}
	}
	// A map is kept only up to spareMax: clear keeps all of a map's room,
	// and after a burst of 100k changes the steady state is a few an
	// interval.
	if pending != nil && len(pending) <= spareMax {
		clear(pending)
		p.mu.Lock()
		p.spare = pending
		p.mu.Unlock()
	}
	if !since.IsZero() && (p.tableSince.IsZero() || since.Before(p.tableSince)) {
		p.tableSince = since
	}
	p.fit()
	var err error
	if p.table.Dirty() > 0 || len(reqs) > 0 {
		actx, cancel := context.WithTimeout(ctx, writeAttemptTimeout)
		err = p.store.Save(actx, p.guard, p.table, reqs)
		cancel()
		p.table.Compact()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		// Requests are deleted only with a write that succeeds.
		p.reqs = append(reqs, p.reqs...)
		p.failing = err
		p.tried = gen
	} else {
		p.tableSince = time.Time{}
		p.wrote = gen
		p.failing = nil
	}
	close(p.written)
	p.written = make(chan struct{})
	return err
}

// fit moves the table to the layout its size calls for (store.Table.Fit):
// a table that grew past 32,768 entries is written once whole in 4,096
// buckets (65,536 past 262,144), so that each fire after rewrites a
// bucket of at most 64 entries, not one of thousands.
func (p *persister) fit() {
	before := p.table.Buckets()
	if p.table.Fit() {
		p.log.Info("state table moved to another layout: written whole once",
			"entries", p.table.Len(), "buckets_before", before, "buckets", p.table.Buckets())
		if p.tableSince.IsZero() {
			p.tableSince = p.clock.Now()
		}
	}
}

// report updates the backlog metrics and, while writes fail, logs an
// ERROR once per failLogEvery.
func (p *persister) report(now time.Time, lastLog *time.Time) {
	p.mu.Lock()
	failing, oldest := p.failing, p.since
	p.mu.Unlock()
	if !p.tableSince.IsZero() && (oldest.IsZero() || p.tableSince.Before(oldest)) {
		oldest = p.tableSince
	}
	age := time.Duration(0)
	if !oldest.IsZero() {
		age = now.Sub(oldest)
	}
	p.m.StateUnpersistedAge.Set(age.Seconds())
	if failing == nil {
		p.m.StatePersistFailing.Set(0)
		if !lastLog.IsZero() {
			p.log.Info("state persisted again", "backlog_age", age.String())
			*lastLog = time.Time{}
		}
		return
	}
	p.m.StatePersistFailing.Set(1)
	if !lastLog.IsZero() && now.Sub(*lastLog) < failLogEvery {
		return
	}
	*lastLog = now
	danger := p.dedupTTL > 0 && age > p.dedupTTL-min(dedupMargin, p.dedupTTL/2)
	if danger {
		p.log.Error("STATE NOT PERSISTED FOR LONGER THAN THE BROKER'S DEDUP HORIZON: a failover now could publish slots twice; fix etcd",
			"err", failing, "backlog_age", age.String(), "dedup_ttl", p.dedupTTL.String(), "dirty_buckets", p.table.Dirty())
		return
	}
	p.log.Error("etcd refuses state writes; still firing, state kept in memory until etcd accepts writes",
		"err", failing, "backlog_age", age.String(), "dirty_buckets", p.table.Dirty())
}
