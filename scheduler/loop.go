package scheduler

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
	"github.com/cenkalti/backoff/v5"
	"github.com/jonboulle/clockwork"
)

// pendingFire is a fire waiting to be published.
type pendingFire struct {
	e      *entry
	slot   time.Time
	due    time.Time
	manual bool
	// failed: a publish of it failed already; what follows is a retry.
	failed bool
	req    *store.Request // the trigger request it answers
	bf     *backfillRun   // the backfill it is a slot of
}

// loop is one term's state, owned by Run's goroutine. It moves slots:
// from the heap to pending (collectDue), from pending to the dispatcher
// (launch), and back to pending when a publish fails. What a slot, a run
// or a report means for its entry is written in the entry's page of the
// books (entryBook, book.go).
type loop struct {
	s       *Scheduler
	term    Term
	guard   election.Fence
	set     *entrySet
	heap    slotHeap
	pending []pendingFire
	books   ledger
	persist *persister
	// metricsMode is the Metrics' mode the entries' cached counters were
	// made in (syncMetrics).
	metricsMode uint32
	// free holds publications to reuse; pubSeq is the last one's number
	// (publishPending).
	free     []*publication
	pubSeq   uint64
	gc       gcGap
	backoff  *backoff.ExponentialBackOff // publish retries while the broker fails
	requests <-chan struct{}
	reports  <-chan outcome.Report // the outcome feed's (nil: outcomes not tracked)
	failLog  repeatLog             // complete's "publish failed"
	due      duePass
	flags    entryFlags // behind or runaway (entryhealth.go)
	// nextSweep is when the loop next looks for removed entries past
	// their grace (sweepRemoved).
	nextSweep time.Time
	bf        backfills
	prep      prepWalk
	// started is how long the term's start took: its state's read, the
	// fence, the rest of begin (catch-up and scheduling), and the admin
	// requests' read (beside begin) and handling, for its log line.
	started struct{ load, fence, rest, requests time.Duration }
}

// duePass is collectDue's, kept between passes: the slots each entry
// added to the pass (made once an entry adds a second), the items it set
// aside, and its late-slot log line, summarised.
type duePass struct {
	count    map[*entry]int
	setAside []*item
	lateLog  lateLog
}

// Run is the loop for one term. It returns when ctx ends (after finishing
// the publish in flight and persisting it), or with ErrTermEnded when the
// fence or etcd says another replica leads.
func (s *Scheduler) Run(ctx context.Context, term Term) error {
	l := &loop{s: s, term: term, guard: term.Fence, books: ledger{cfg: &s.cfg, log: s.log, token: term.Token, dirty: map[string]bool{}}}
	termEnded := s.cfg.Metrics.termStarted(ctx, s.entries.Load(), term, s.cfg.Clock.Now())
	defer termEnded()
	// The admin requests are read while the term begins: a read of etcd
	// fewer before the term schedules (up to ~0.3 s of a shard's move on
	// a loaded etcd). One written after this read is the watch's.
	type pendingRequests struct {
		reqs []store.Request
		rev  int64
		err  error
		took time.Duration
	}
	requested := make(chan pendingRequests, 1)
	go func() {
		read := s.cfg.Clock.Now()
		reqs, rev, err := s.cfg.Store.PendingRequests(ctx)
		requested <- pendingRequests{reqs, rev, err, s.cfg.Clock.Since(read)}
	}()
	table, err := l.begin(ctx)
	pending := <-requested
	if err != nil {
		return err
	}
	// The persister owns the table from here; the loop keeps its own view
	// in l.books.states and hands it changes.
	stopPersister := l.startPersister(ctx, table)
	defer stopPersister()

	read := s.cfg.Clock.Now()
	reqs, rev, err := pending.reqs, pending.rev, pending.err
	if err != nil {
		s.cfg.Metrics.EtcdErrors.Inc()
		s.log.Warn("list admin requests", "err", err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	l.requests = s.cfg.Store.WatchRequests(wctx, rev)
	l.handleRequests(ctx, reqs)
	l.started.requests = pending.took + s.cfg.Clock.Since(read)
	s.log.Info("scheduling", "token", term.Token, "entries", len(l.set.list), "catchup_fires", len(l.pending),
		"load_state", l.started.load.String(), "fence", l.started.fence.String(), "start", l.started.rest.String(), "requests", l.started.requests.String())
	if term.Scheduling != nil {
		term.Scheduling()
	}
	return l.run(ctx)
}

// run is the term's loop: publish what is pending, collect what is due,
// and wait for the next slot, a reload, an admin request or the end.
func (l *loop) run(ctx context.Context) error {
	s := l.s
	t := waitTimer{clock: s.cfg.Clock}
	defer t.close()
	for {
		if err := l.tend(ctx); err != nil {
			return err
		}
		if len(l.pending) > 0 {
			if done, err := l.publishRound(ctx, &t); done {
				return err
			}
			continue
		}
		l.collectDue(s.cfg.Clock.Now())
		if len(l.pending) > 0 {
			continue
		}
		t.arm(l.idleWait())
		if _, done, err := l.serve(ctx, t.C(), true); done {
			return err
		}
		t.disarm()
	}
}

// waitTimer is the loop's one timer. It is armed only where the loop
// waits on it: an armed timer then means an idle loop, which tests rely
// on. So it is made at the first wait, not armed and stopped up front.
type waitTimer struct {
	clock clockwork.Clock
	t     clockwork.Timer
}

func (w *waitTimer) arm(d time.Duration) {
	if w.t == nil {
		w.t = w.clock.NewTimer(d)
		return
	}
	w.t.Reset(d)
}

func (w *waitTimer) C() <-chan time.Time { return w.t.Chan() }

// disarm stops the timer and drains a fire the wait did not take.
func (w *waitTimer) disarm() {
	if !w.t.Stop() {
		select {
		case <-w.t.Chan():
		default:
		}
	}
}

func (w *waitTimer) close() {
	if w.t != nil {
		w.t.Stop()
	}
}

// tend does what each pass of the loop owes besides its slots: the due
// times for /metrics, the persister's verdict, the workers' reports and
// lost runs, the sweep of removed entries and the backfills' next slots.
func (l *loop) tend(ctx context.Context) error {
	s := l.s
	l.reportDue()
	if err := l.persist.failed(); err != nil {
		return err
	}
	if l.reports != nil {
		now := s.cfg.Clock.Now()
		l.drainReports(now)
		l.sweepLost(now)
	}
	if now := s.cfg.Clock.Now(); !now.Before(l.nextSweep) {
		if err := l.sweepRemoved(ctx, now); err != nil {
			return err
		}
	}
	if len(l.bf.running) > 0 || len(l.bf.retry) > 0 {
		l.bf.wait = l.feedBackfills(ctx, s.cfg.Clock.Now())
	} else {
		l.bf.wait = 0
	}
	return nil
}

// publishRound publishes what is pending, then serves the control that
// is ready; after a transient failure it waits out the backoff, serving
// control meanwhile. done means the term is over, with run's result.
func (l *loop) publishRound(ctx context.Context, t *waitTimer) (done bool, err error) {
	s := l.s
	err = l.publishPending(ctx)
	switch {
	case err == nil:
		// Control between slices of work: with slots always due the loop
		// never reaches its wait, and a reload, a DELETE, a pause or the
		// end of the term would otherwise wait for the work to run out.
		_, done, err = l.serve(ctx, nil, false)
		return done, err
	case errors.Is(err, ErrTermEnded):
		return true, err
	case ctx.Err() != nil:
		return true, l.finish()
	}
	// Transient: keep the slots pending and retry with backoff, serving
	// control meanwhile (a broker outage must not hold a DELETE for the
	// length of the backoff).
	t.arm(l.nextBackoff())
	for fired := false; !fired; {
		if fired, done, err = l.serve(ctx, t.C(), true); done {
			return true, err
		}
	}
	// Slots that came due meanwhile join the retry, up to a batch: one
	// fire that keeps failing (a queue key of the wrong type) then delays
	// the others by the backoff instead of stopping them, and a broker
	// that is down leaves at most a batch pending, not every slot of the
	// outage. Those the outage made late go through their catch-up
	// policy, as late slots found in the heap do.
	now := s.cfg.Clock.Now()
	l.catchUpPending(now)
	l.collectDue(now)
	return false, nil
}

// idleWait is how long the idle loop may wait: until its next slot, the
// next templates to compile, the next lost-run sweep or the backfills'
// next slot.
func (l *loop) idleWait() time.Duration {
	s := l.s
	more := l.prepare(s.cfg.Clock.Now())
	// Measured from the clock as the timer is armed: time that passed
	// since now was read must not push the deadline back.
	wait := time.Hour
	if len(l.heap) > 0 {
		wait = max(time.Duration(l.heap[0].due-s.cfg.Clock.Now().UnixNano()), 0)
	}
	if more {
		wait = min(wait, prepareAgain)
	}
	if len(l.books.unfinished) > 0 {
		wait = min(wait, max(l.books.nextLostSweep.Sub(s.cfg.Clock.Now()), 0))
	}
	if l.bf.wait > 0 {
		wait = min(wait, l.bf.wait)
	} else if len(l.bf.running) > 0 {
		wait = min(wait, backfillSave) // progress to write, or the end to record
	}
	return wait
}

// serve handles what needs the loop besides its slots: the end of the
// term, a reload, admin requests, a worker's report, the persister's
// failure. With block it waits for one of them or for timer (fired says
// the timer it was); without, it handles one that is ready, if any, and
// returns at once. done means the term is over, with run's result.
func (l *loop) serve(ctx context.Context, timer <-chan time.Time, block bool) (fired, done bool, err error) {
	s := l.s
	if !block {
		select {
		case <-ctx.Done():
		case <-s.reload:
			l.applyReload(s.cfg.Clock.Now())
			l.reloadBackfills(ctx, s.cfg.Clock.Now())
			return false, false, nil
		case _, ok := <-l.requests:
			done, err = l.requestsChanged(ctx, ok)
			return false, done, err
		case r := <-l.reports:
			l.applyReports(r, s.cfg.Clock.Now())
			return false, false, nil
		case <-l.persist.errc:
			return false, false, nil
		default:
			return false, false, nil
		}
		return false, true, l.finish()
	}
	select {
	case <-ctx.Done():
		return false, true, l.finish()
	case <-timer:
		return true, false, nil
	case <-s.reload:
		l.applyReload(s.cfg.Clock.Now())
		l.reloadBackfills(ctx, s.cfg.Clock.Now())
	case _, ok := <-l.requests:
		done, err = l.requestsChanged(ctx, ok)
		return false, done, err
	case r := <-l.reports:
		l.applyReports(r, s.cfg.Clock.Now())
	case <-l.persist.errc:
	}
	return false, false, nil
}

func (l *loop) nextBackoff() time.Duration {
	if l.backoff == nil {
		l.backoff = retry.Backoff(50*time.Millisecond, 2*time.Second)
	}
	return l.backoff.NextBackOff()
}

// collectDue moves every due slot from the heap to pending, advancing each
// entry to its next slot. An entry adds at most entryShare slots to one
// pass: one whose slots are always due (an interval the loop cannot
// sustain) is set aside for the rest of the pass, so the others' slots
// still go out on time, and it is flagged as behind until it catches up.
func (l *loop) collectDue(now time.Time) {
	defer l.due.lateLog.flush(l.s.log, now)
	nowNs := now.UnixNano()
	clear(l.due.count)
	for len(l.heap) > 0 && l.heap[0].due <= nowNs && len(l.pending) < l.s.cfg.BatchSize {
		it := l.heap[0]
		e := it.e
		if time.Duration(nowNs-it.due) > stepLateness {
			l.due.lateLog.add(l.catchUpLate(it, now))
			continue
		}
		if st := l.books.states[e.Name]; st != nil && st.Paused {
			l.s.cfg.Metrics.Missed.WithLabelValues(e.Name, ReasonPaused).Inc()
		} else {
			l.queue(pendingFire{e: e, slot: it.slot, due: it.dueTime()})
		}
		next := e.sched.Next(it.slot)
		if next.IsZero() {
			heap.Pop(&l.heap)
			e.it = nil
			l.s.cfg.Metrics.scheduled(e.Name, time.Time{})
			continue
		}
		if !next.After(it.slot) {
			l.stopRunaway(e, fmt.Sprintf("its schedule gave %s after %s", schedule.FormatSlot(next), schedule.FormatSlot(it.slot)), now)
			continue
		}
		it.set(next)
		l.s.cfg.Metrics.scheduled(e.Name, it.dueTime())
		if it.due > nowNs {
			l.caughtUp(e, now)
			heap.Fix(&l.heap, 0)
			continue
		}
		// Still due: the entry is behind its own schedule.
		if l.due.count == nil {
			l.due.count = map[*entry]int{}
		}
		if l.due.count[e]++; l.due.count[e] < entryShare {
			heap.Fix(&l.heap, 0)
			continue
		}
		heap.Pop(&l.heap)
		l.due.setAside = append(l.due.setAside, it)
		l.fallBehind(e, now)
	}
	for _, it := range l.due.setAside {
		heap.Push(&l.heap, it)
	}
	clear(l.due.setAside)
	l.due.setAside = l.due.setAside[:0]
}

// queue puts p at the end of pending.
func (l *loop) queue(p pendingFire) {
	l.pending = append(l.pending, p)
	l.s.cfg.Metrics.queued(p.e.Name, p.due)
}

// queueHeld queues the slots the books freed (buffer_one's, once the run
// that held it ended).
func (l *loop) queueHeld() {
	if len(l.books.held) > 0 {
		l.pending = append(l.pending, l.books.held...)
		clear(l.books.held)
		l.books.held = l.books.held[:0]
	}
}

// entryShare is the most slots one entry adds to a collectDue pass. A
// regular entry adds one; a short interval after a slow burst a few.
const entryShare = 8
