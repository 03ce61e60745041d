package scheduler

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
)

// publishPending publishes pending fires in batches, then hands their new
// state to the persister. Fires whose publish failed stay pending.
//
// A burst publishes batch after batch, and the loop's own share of a
// batch (recording its results, collecting and building the next) used to
// leave Redis idle: at 20,000 entries due at once, ~6 of each batch's
// ~22 ms. So the next batch is launched while the current one is out, when
// nothing one decides can change the other: both hold only scheduled
// slots of entries without max_runs or an overlap policy, no entry is in
// both, and no state must be written between them (PersistEachBatch).
// Publishes still run one at a time, in launch order.
//
// A batch the broker took whole is recorded only once the chain ends, so
// the burst goes out first and the bookkeeping (~2 µs a fire: states,
// metrics, the console's timeline) follows it. A later batch is launched
// only once every batch but the one just before it is known to have gone
// out whole, so a failed slot is still retried before any later slot of
// its entry (whose mark would make the earlier one a duplicate).
func (l *loop) publishPending(ctx context.Context) error {
	cur := l.launch(ctx, nil)
	var out []*publication // gone out whole, to be recorded
	for chained := 1; ; chained++ {
		var next *publication
		if chained < maxChain && l.chains(cur) {
			if len(l.pending) == 0 {
				l.collectDue(l.s.cfg.Clock.Now())
			}
			if l.disjoint(cur) {
				next = l.launch(ctx, cur)
			}
		}
		<-cur.done
		if next != nil && cur.whole() {
			out = append(out, cur)
			cur = next
			continue
		}
		out = append(out, cur)
		if next != nil {
			out = append(out, next)
		}
		err := l.record(ctx, out)
		if len(out) > 1 {
			l.gc.end() // a burst: collect in the gap after it
		}
		return err
	}
}

// record completes a chain's publications in launch order and frees
// them. Ending the term wins over another error.
func (l *loop) record(ctx context.Context, pubs []*publication) error {
	defer func() {
		for _, pub := range pubs {
			<-pub.done
			// A freed publication keeps its arrays, not what they point
			// to: the fires' templates, dropped by their entries after
			// the publish, stayed alive here (17 publications of 2,048
			// fires: ~60 MB of templates at 900,000 entries).
			clear(pub.fires)
			clear(pub.batch)
			l.free = append(l.free, pub)
		}
	}()
	var first error
	for i, pub := range pubs {
		err := l.complete(ctx, pub, i == len(pubs)-1)
		if errors.Is(err, ErrTermEnded) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// maxChain is the most batches publishPending publishes back to back
// (~0.35 s at 20,000 fires a second) before the loop looks at its
// requests, reports and reloads again.
const maxChain = 16

// publication is one batch handed to the Dispatcher, from its launch to
// the loop recording its results (complete). Freed ones are kept for the
// next, so a burst's batches reuse their buffers.
type publication struct {
	seq     uint64
	batch   []pendingFire
	fires   []celery.Fire
	results []broker.Result
	// plain: every fire is plainFire's, whose result changes nothing
	// another batch decides.
	plain bool
	// err and at are Publish's error and when it returned; done is closed
	// then.
	err  error
	at   time.Time
	done chan struct{}
}

// launch takes a batch off the front of pending and publishes it in its
// own goroutine, after prev's publish (if any) has returned. The caller
// must complete it.
func (l *loop) launch(ctx context.Context, prev *publication) *publication {
	s := l.s
	n := min(len(l.pending), s.cfg.BatchSize)
	l.pubSeq++
	var pub *publication
	if n := len(l.free); n > 0 {
		pub, l.free = l.free[n-1], l.free[:n-1]
	} else {
		pub = &publication{}
	}
	pub.seq = l.pubSeq
	now := s.cfg.Clock.Now()
	pub.batch = append(pub.batch[:0], l.admitted(l.pending[:n], now)...)
	// Drop the batch from the queue without copying what is left.
	if rest := l.pending[n:]; len(rest) > 0 {
		l.pending = rest
	} else if cap(l.pending) <= 4*s.cfg.BatchSize {
		// The queue is empty: the next batch reuses its array (a new one
		// every batch was a tenth of a busy leader's allocations). A
		// larger one, left by a catch-up, goes.
		clear(l.pending[:n])
		l.pending = l.pending[:0]
	} else {
		l.pending = nil
	}
	pub.fires = pub.fires[:0]
	pub.plain = true
	for _, p := range pub.batch {
		p.e.pubSeq = pub.seq
		if !plainFire(p) {
			pub.plain = false
		}
		f := celery.Fire{Task: l.compiled(p.e), Slot: p.slot, Manual: p.manual, Late: p.late(now)}
		if p.req != nil {
			f.Request = p.req.ID
		}
		if p.bf != nil {
			f.Backfill = p.bf.job.ID
		}
		pub.fires = append(pub.fires, f)
	}
	pub.results = append(pub.results[:0], make([]broker.Result, len(pub.batch))...)
	pub.err = nil
	pub.done = make(chan struct{})
	if len(pub.batch) == 0 {
		pub.at = s.cfg.Clock.Now()
		close(pub.done)
		return pub
	}
	// prev's channel is read here, not in the goroutine: by the time that
	// runs, prev may have completed and its buffers been launched again.
	var after <-chan struct{}
	if prev != nil {
		after = prev.done
	}
	go func() {
		defer close(pub.done)
		if after != nil {
			<-after
		}
		pub.err = s.cfg.Dispatcher.Publish(ctx, l.term.Token, pub.fires, pub.results)
		pub.at = s.cfg.Clock.Now()
	}()
	return pub
}

// plainFire says whether p decides nothing from the state of its entry's
// earlier fires: a scheduled slot of an entry without max_runs (counted
// runs) or an overlap policy (a run in progress holds the next).
func plainFire(p pendingFire) bool {
	return !p.manual && p.req == nil && p.bf == nil && p.e.MaxRuns() <= 0 && !p.e.HoldsOverlap()
}

// whole says whether the broker took every fire of pub (pushed or a
// duplicate).
func (pub *publication) whole() bool {
	if pub.err != nil {
		return false
	}
	for _, r := range pub.results {
		if r != broker.ResultOK && r != broker.ResultDuplicate {
			return false
		}
	}
	return true
}

// chains says whether the batch after cur may be launched before cur's
// results are recorded: cur is plain, and no state write must land
// between the two publishes.
func (l *loop) chains(cur *publication) bool {
	return cur.plain && !l.s.cfg.PersistEachBatch && !l.books.mustFlush
}

// disjoint says whether the next batch is plain and shares no entry with
// cur.
func (l *loop) disjoint(cur *publication) bool {
	n := min(len(l.pending), l.s.cfg.BatchSize)
	if n == 0 {
		return false
	}
	for _, p := range l.pending[:n] {
		if p.e.pubSeq == cur.seq || !plainFire(p) {
			return false
		}
	}
	return true
}

// complete waits for pub's publish and writes each fire's result in its
// entry's book, in launch order. Fires that failed go back to the front
// of pending. save hands the states changed so far to the persister.
func (l *loop) complete(ctx context.Context, pub *publication, save bool) error {
	<-pub.done
	s := l.s
	err, at := pub.err, pub.at
	l.syncMetrics()
	l.books.fireLog.on = s.cfg.FireLogLimit > 0 && s.log.Enabled(ctx, slog.LevelInfo)
	var failed []pendingFire
	for i, p := range pub.batch {
		switch r := pub.results[i]; r {
		case broker.ResultOK, broker.ResultDuplicate:
			if l.book(p.e).Published(p, pub.fires[i].ID, r, at) {
				l.finishEntry(p.e)
			}
			l.dropTemplate(p)
		case broker.ResultStale:
			l.book(p.e).Failed(p, r, err, at)
			return l.refused(pub)
		default:
			l.book(p.e).Failed(p, r, err, at)
			p.failed = true
			failed = append(failed, p)
		}
	}
	if l.books.fireLog.on {
		l.books.fireLog.summarise(s.log, at, l.term.Token)
	}
	// One state per entry per batch, however often it fired in it.
	if save {
		l.saveBatch(ctx)
	}
	// Failures, rare, go back in front (in slot order).
	if len(failed) > 0 {
		l.pending = append(failed, l.pending...)
	}
	return l.afterPublish(err, at)
}

// refused ends the term: a newer leader raised the fence.
func (l *loop) refused(pub *publication) error {
	stale := 0
	for _, r := range pub.results {
		if r == broker.ResultStale {
			stale++
		}
	}
	l.s.log.Warn("stale publish refused", "token", l.term.Token, "fires", stale)
	return fmt.Errorf("%w: fence raised by a newer leader", ErrTermEnded)
}

// afterPublish notes how a publish went (err), for readiness and the retry
// backoff.
func (l *loop) afterPublish(err error, at time.Time) error {
	s := l.s
	if err != nil {
		if errors.Is(err, broker.ErrStale) {
			return fmt.Errorf("%w: %w", ErrTermEnded, err)
		}
		s.cfg.Metrics.RedisErrors.Inc()
		s.setPublishErr(err)
		if ok, held := l.failLog.allow(at); ok {
			s.log.Warn("publish failed; slots stay pending", "err", err, "pending", len(l.pending), "failures_not_logged", held)
		}
		return err
	}
	s.setPublishErr(nil)
	if l.backoff != nil {
		l.backoff.Reset()
	}
	return nil
}

// admitted is what of batch goes out: the fires each entry's book
// admits, in order.
func (l *loop) admitted(batch []pendingFire, now time.Time) []pendingFire {
	l.syncMetrics()
	kept := batch[:0]
	var t batchTally
	for _, p := range batch {
		if l.book(p.e).Admits(p, &t, now) {
			kept = append(kept, p)
		}
	}
	l.queueHeld()
	return kept
}

// finishEntry takes e off the heap: it has made its max_runs.
func (l *loop) finishEntry(e *entry) {
	if cur := l.set.get(e.Name); cur != nil && cur.it != nil {
		heap.Remove(&l.heap, cur.it.index)
		cur.it = nil
	}
	l.s.cfg.Metrics.scheduled(e.Name, time.Time{})
	l.s.log.Info("entry finished: it made its max_runs", "entry", e.Name, "max_runs", e.MaxRuns())
}

// saveBatch hands a batch's changed states to the persister, and waits
// for the write where the next batch depends on it.
func (l *loop) saveBatch(ctx context.Context) {
	if len(l.books.dirty) == 0 {
		return
	}
	cfg := &l.s.cfg
	l.books.handOver()
	// While etcd refuses writes, waiting for each batch's write would
	// make every fire late: fire on time, as with Redis, and let the
	// state catch up (the broker's journal covers the gap).
	if (!cfg.PersistEachBatch && !l.books.mustFlush) || l.persist.writeError() != nil {
		return
	}
	// A max_runs count is written before the entry fires again, so a new
	// leader cannot count short and run once too often.
	l.books.mustFlush = false
	fctx, cancel := context.WithTimeout(ctx, max(cfg.StateInterval, writeAttemptTimeout))
	defer cancel()
	if err := l.persist.flush(fctx, true); err != nil && !errors.Is(err, ErrTermEnded) {
		l.s.log.Warn("batch state not persisted before the next batch", "err", err)
	}
}
