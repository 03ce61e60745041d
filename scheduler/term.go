package scheduler

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/store"
)

// sweepEvery is how often a long-lived term drops the state and broker
// keys of entries removed longer than RemovedGrace ago; a new term does
// it at its start.
const sweepEvery = time.Hour

// nextSweepAt is when a sweep done at now is next due: sweepEvery later,
// moved to the second half of its minute. A sweep walks every entry's state
// on the loop (a few hundred ms at a million entries), and crontab slots
// fall due together at a minute's start.
func nextSweepAt(now time.Time) time.Time {
	t := now.Add(sweepEvery)
	if t.Second() < 30 {
		t = t.Truncate(time.Minute).Add(30 * time.Second)
	}
	return t
}

// begin starts a term: it loads the state and raises the fence before
// anything else (from then on a deposed leader's publishes are refused),
// prunes removed entries, and schedules every entry with its catch-up.
// It returns the table the persister takes over.
func (l *loop) begin(ctx context.Context) (*store.Table, error) {
	s := l.s
	var (
		table *store.Table
		err   error
	)
	mark := s.cfg.Clock.Now()
	lap := func(d *time.Duration) {
		now := s.cfg.Clock.Now()
		*d, mark = now.Sub(mark), now
	}
	defer lap(&l.started.rest)
	if err = s.retry(ctx, "load state", func() error {
		table, err = s.cfg.Store.Load(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	lap(&l.started.load)
	// A fence the broker refuses is a leader that cannot publish: say so
	// (readiness, the console) while it retries, rather than let its
	// first slots pass as a loop not keeping up.
	if err := s.retry(ctx, "raise fence", func() error {
		err := s.cfg.Dispatcher.RaiseFence(ctx, l.term.Token)
		if err != nil && ctx.Err() == nil && !errors.Is(err, broker.ErrStale) {
			s.setPublishErr(fmt.Errorf("raise the fence: %w", err))
		}
		return err
	}); err != nil {
		return nil, err
	}
	s.setPublishErr(nil) // the broker took a write of this term
	lap(&l.started.fence)
	now := s.cfg.Clock.Now()
	if !l.term.Elected.IsZero() && l.term.Elected.Before(now) {
		now = l.term.Elected
	}
	l.set, _, _ = s.takeDelta() // the term starts from the whole set
	s.applied.Store(l.set)
	// Removed entries are marked, or deleted after their grace, in the
	// table itself: the persister's first write stores that.
	configured := l.set.names()
	_, gone := table.Prune(func(n string) bool { _, ok := configured[n]; return ok }, now, s.cfg.RemovedGrace)
	l.books.states = table.States()
	l.nextSweep = nextSweepAt(now)
	l.books.unfinished = map[string]bool{}
	if f := s.cfg.Outcomes; f != nil {
		l.reports = f.Reports()
		l.adoptUnrecorded(ctx, now)
		l.loadOutcomes()
	}
	if err := l.forget(ctx, gone); err != nil {
		return nil, err
	}
	// Sized once: grown by appends, a shard's start at 56,000 entries
	// copied the heap a dozen times while a collection may be marking.
	l.heap = make(slotHeap, 0, len(l.set.list))
	for _, e := range l.set.list {
		e.it = nil // a last term's
		l.startEntry(e, l.books.states[e.Name], now, true)
	}
	heap.Init(&l.heap)
	// The first baselines (every entry of a first start) go straight
	// into the table, not through the persister's change map.
	for _, st := range l.books.baseline {
		table.Set(st.Clone()) // the table is the persister's from here
	}
	l.books.baseline = nil
	if before := table.Buckets(); table.Fit() {
		s.log.Info("state table moved to another layout: written whole once",
			"entries", table.Len(), "buckets_before", before, "buckets", table.Buckets())
	}
	return table, nil
}

// startPersister runs the term's persister on table until the returned
// stop is called. It outlives ctx, so the loop's last persist runs.
func (l *loop) startPersister(ctx context.Context, table *store.Table) (stop func()) {
	s := l.s
	pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
	l.persist = newPersister(s.cfg.Store, l.guard, table, s.cfg)
	l.books.persist = l.persist
	s.persist.Store(l.persist)
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() { defer pwg.Done(); l.persist.run(pctx) }()
	return func() {
		pcancel()
		pwg.Wait()
		s.persist.CompareAndSwap(l.persist, nil)
	}
}

// startEntry schedules an entry at the start of a term (catchUp) or when a
// reload adds or changes it.
func (l *loop) startEntry(e *entry, st *store.EntryState, now time.Time, catchUp bool) {
	if !e.Enabled {
		return
	}
	owed := st != nil && !st.CatchupFrom().IsZero()
	backfill := !owed && !e.StartAt().IsZero() && e.Catchup == config.CatchupAll
	if !backfill && (!owed || !catchUp) {
		// From now on this entry's slots are owed (a changed one's: it
		// owes nothing from before the change; a new one's from when it
		// was written, if known): record that before its first fire, so a
		// leader that takes over before then still owes it.
		if st == nil {
			st = l.books.state(e.Name)
		}
		st.Since = now
		if !owed {
			st.Since = owedSince(e.Entry, l.s.cfg.FirstSeen, now)
		}
		l.books.baseline = append(l.books.baseline, *st)
	}
	e.sched = Anchored(e.Entry, st, now)
	plan := planCatchup(e.Entry, e.sched, st, now)
	l.clearFlags(e.Name) // a new or changed definition starts afresh
	if why := plan.insane(e.Entry, now); why != "" {
		l.stopRunaway(e, why, now)
		return
	}
	l.applyPlan(e, plan)
	m := l.s.cfg.Metrics
	if plan.next.IsZero() {
		return // fired its last slot (a past one-off)
	}
	if after := e.sched.Next(plan.next); !after.IsZero() {
		m.setPeriod(e.Name, after.Sub(plan.next))
	}
	next := newItem(e, plan.next)
	e.it = next
	l.s.cfg.Metrics.scheduled(e.Name, next.dueTime())
	l.heap = append(l.heap, next)
	next.index = len(l.heap) - 1
}

// owedSince is when an entry with no baseline begins to owe its slots:
// when its definition was written, when that is known (a runtime entry)
// and past; else when this replica first saw it, if its source (the file,
// django-celery-beat) gained it while the replica ran (firstSeen) and
// that is past; else now. So a baseline a leader never stored (it
// stopped, or was killed, before its write; or before it saw the entry at
// all) costs the entry a late slot, caught up by its policy, never a
// missed one; and no entry owes a slot from before it existed. A changed
// definition's baseline is not this: it has one, and owes nothing from
// before the change (startEntry).
func owedSince(e *config.Entry, firstSeen func(string) time.Time, now time.Time) time.Time {
	d := e.DefinedBy()
	if d.IsZero() && firstSeen != nil {
		d = firstSeen(e.Name)
	}
	if !d.IsZero() && d.Before(now) {
		return d
	}
	return now
}

// sweepRemoved drops the state and broker keys of entries removed longer
// than RemovedGrace ago, as a new term's start does.
func (l *loop) sweepRemoved(ctx context.Context, now time.Time) error {
	l.nextSweep = nextSweepAt(now)
	var (
		gone    []string
		changed []store.EntryState
	)
	configured := l.set.names()
	for name, st := range l.books.states {
		_, has := configured[name]
		switch c, g := st.Reconcile(has, now, l.s.cfg.RemovedGrace); {
		case g:
			gone = append(gone, name)
			delete(l.books.states, name)
		case c:
			changed = append(changed, *st)
		}
	}
	if len(changed) > 0 {
		l.persist.save(changed...)
	}
	if len(gone) == 0 {
		return nil
	}
	l.persist.remove(gone...)
	return l.forget(ctx, gone)
}

// forget drops what the broker keeps of entries gone for good. Their etcd
// state is gone (or going) with them, so if one comes back it starts
// afresh, from now: no slot it had before can be owed again. A failure is
// logged and left: the keys are small, and the next term or sweep sees
// only entries whose state still exists.
func (l *loop) forget(ctx context.Context, names []string) error {
	f, ok := l.s.cfg.Dispatcher.(Forgetter)
	if !ok || len(names) == 0 {
		return nil
	}
	err := f.Forget(ctx, l.term.Token, names)
	switch {
	case errors.Is(err, broker.ErrStale):
		return fmt.Errorf("%w: forget removed entries: %w", ErrTermEnded, err)
	case err != nil:
		l.s.log.Warn("broker keys of removed entries not dropped", "entries", len(names), "err", err)
	default:
		l.s.log.Info("removed entries forgotten", "entries", len(names))
	}
	return nil
}

// flushBaseline hands the Since baselines set by startEntry to the
// persister.
func (l *loop) flushBaseline() {
	if len(l.books.baseline) > 0 {
		l.persist.saveNow(l.books.baseline...)
		l.books.baseline = nil
	}
}

// finishBudget bounds the final state write on shutdown. Persisting is an
// optimisation here (the next leader's re-publish of an unrecorded slot
// dedups), so it must not delay the handover when etcd is slow. A write
// that succeeds takes tens of ms; a shard's move at 900,000 entries,
// with etcd serving other replicas' loads, spent its whole budget in
// 3 of 13 handovers, when it was 500 ms: a write still pending at 250 ms
// is one etcd is too busy to answer within the move.
const finishBudget = 250 * time.Millisecond

// finish persists everything published before the loop stops, within
// finishBudget.
func (l *loop) finish() error {
	l.books.fireLog.summarise(l.s.log, l.s.cfg.Clock.Now().Add(time.Second), l.term.Token)
	ctx, cancel := context.WithTimeout(context.Background(), finishBudget)
	defer cancel()
	if err := l.persist.flush(ctx, false); err != nil {
		l.s.log.Warn("state not fully persisted before stopping; the next leader re-publishes (deduplicated)", "err", err)
		return nil
	}
	if c, ok := l.s.cfg.Dispatcher.(TermCloser); ok {
		if err := c.CloseTerm(ctx, l.term.Token); err != nil {
			l.s.log.Warn("the term's clean end not recorded on the broker; a resize will ask for the shard to be led once more first", "err", err)
		}
	}
	return nil
}
