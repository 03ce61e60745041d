package scheduler

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
)

// The loop's books: what it keeps of each entry besides its next slot.
// The loop moves slots, from the heap to pending to the dispatcher; what
// happens to a slot (published, failed, held, skipped) and to a run (a
// worker's report, lost, unreported) is written in the entry's page of
// the books, an entryBook, which keeps the entry's state (its last slot,
// its max_runs count, its runs and their outcomes, the slot an overlap
// holds), counts it, tells the console, and says what the loop must do
// with its slots next. All of it runs on the loop's goroutine.

// ledger is the loop's books, owned by its goroutine, with what writing
// in them needs: the config (metrics, the outcome feed, the console's
// observer), the log, and the persister that completes admin requests.
// It holds no slot of the heap's or pending's: a slot it frees (the one
// buffer_one held) waits in held for the loop to queue it.
type ledger struct {
	cfg     *Config
	log     *slog.Logger
	token   int64 // the term's, for the fire log
	persist *persister
	fireLog fireLog
	held    []pendingFire
	// states is each entry's state as etcd keeps it, by name, removed
	// entries' too within their grace. The persister writes copies.
	states   map[string]*store.EntryState
	dirty    map[string]bool    // entries changed since the last hand-over
	changed  []store.EntryState // their new state, handed to the persister
	baseline []store.EntryState // Since baselines to persist
	// unfinished holds the entries whose newest run has not ended, which
	// sweepLost looks at every lostSweep.
	unfinished    map[string]bool
	nextLostSweep time.Time
	// mustFlush: a batch changed a max_runs count, which is written
	// before the next batch. urgent: a change among dirty must be written
	// at once (saveNow).
	mustFlush, urgent bool
}

// requeue hands p, a slot the books held, back to the loop.
func (bk *ledger) requeue(p pendingFire) {
	bk.held = append(bk.held, p)
	bk.cfg.Metrics.queued(p.e.Name, p.due)
}

// state returns name's state, made empty on first use.
func (bk *ledger) state(name string) *store.EntryState {
	st := bk.states[name]
	if st == nil {
		st = &store.EntryState{Name: name}
		bk.states[name] = st
	}
	return st
}

// handOver gives the states changed since the last hand-over to the
// persister: at once if one of them must be seen by a next leader without
// delay.
func (bk *ledger) handOver() {
	if len(bk.dirty) == 0 {
		return
	}
	bk.changed = bk.changed[:0]
	for name := range bk.dirty {
		if st := bk.states[name]; st != nil {
			bk.changed = append(bk.changed, *st)
		}
	}
	clear(bk.dirty)
	if bk.urgent {
		bk.urgent = false
		bk.persist.saveNow(bk.changed...)
	} else {
		bk.persist.save(bk.changed...)
	}
}

// entryBook is one entry's page in the loop's books. It is a view, made
// for each event, not a record kept per entry: a million entries' states
// are held in 112-byte allocations (store.EntryState), and a record of its
// own for each would add another.
type entryBook struct {
	bk   *ledger
	e    *entry // its definition; nil once it left the config
	name string
}

// book is e's page.
func (l *loop) book(e *entry) entryBook { return entryBook{bk: &l.books, e: e, name: e.Name} }

// bookOf is the page of the entry named name, configured or not.
func (l *loop) bookOf(name string) entryBook {
	return entryBook{bk: &l.books, e: l.set.get(name), name: name}
}

// state is the entry's state, made on first use; stored is the one kept,
// or nil.
func (b entryBook) state() *store.EntryState  { return b.bk.state(b.name) }
func (b entryBook) stored() *store.EntryState { return b.bk.states[b.name] }
func (b entryBook) changed()                  { b.bk.dirty[b.name] = true }

// tracking says whether the loop records outcomes at all.
func (bk *ledger) tracking() bool { return bk.cfg.Outcomes != nil }

// DefaultOutcomeLive is Config.OutcomeLive's default.
const DefaultOutcomeLive = 10 * time.Minute

// records says whether a publish of e at now is recorded as a run: always
// for an entry whose scheduling depends on outcomes (overlap,
// pause_after_failures), else only while some source reports: with no
// worker sending events, recording every fire in etcd would cost each
// fire for nothing.
func (bk *ledger) records(e *entry, now time.Time) bool {
	if !bk.tracking() {
		return false
	}
	if e.TracksOutcomes() {
		return true
	}
	live := bk.cfg.OutcomeLive
	if live <= 0 {
		live = DefaultOutcomeLive
	}
	return bk.cfg.Outcomes.LastAnyReport().After(now.Add(-live))
}

// runID is the task id of one of e's runs.
func (bk *ledger) runID(name string, r *outcome.Run) string {
	if r.TaskID != "" {
		return r.TaskID
	}
	id := celery.SlotIDOf(bk.cfg.Cluster, name, r.Slot)
	return string(id[:])
}

// stepID is the task id of step n of run r's chain (0: the run's own
// task), as the message carried it (celery.StepID).
func (bk *ledger) stepID(name string, r *outcome.Run, n int) string {
	id := bk.runID(name, r)
	if n == 0 {
		return id
	}
	var head [36]byte
	copy(head[:], id)
	sid := celery.StepID(head, n)
	return string(sid[:])
}

// watchRun watches run r's task ids: its own and, when it has a chain,
// each chained step's, so a run costs the feed at most its chain's
// length (celery.MaxChainSteps + 1) and nothing once it ends.
func (bk *ledger) watchRun(name string, r *outcome.Run) {
	f := bk.cfg.Outcomes
	f.Watch(bk.runID(name, r), name)
	for n := 1; n <= int(r.Chain); n++ {
		f.WatchStep(bk.stepID(name, r, n), name, n)
	}
}

// unwatchRun stops watching what watchRun watched.
func (bk *ledger) unwatchRun(name string, r *outcome.Run) {
	for n := 0; n <= int(r.Chain); n++ {
		bk.cfg.Outcomes.Unwatch(bk.stepID(name, r, n))
	}
}

// chainOf is how many chained steps follow e's task in its messages.
func chainOf(e *entry) uint8 {
	if c := e.Canvas(); c != nil {
		return uint8(len(c.Chain)) // at most celery.MaxChainSteps
	}
	return 0
}

// Published records a fire the broker took: pushed, or found pushed by an
// earlier term (r is broker.ResultDuplicate: the slot was published, once,
// and that is its result). finished says the entry has made its max_runs:
// the loop takes it off the heap.
func (b entryBook) Published(p pendingFire, id [36]byte, r broker.Result, at time.Time) (finished bool) {
	bk, m := b.bk, b.bk.cfg.Metrics
	dedup := r == broker.ResultDuplicate
	if dedup {
		// An earlier term died before recording it. The refusal is only
		// worth a counter.
		m.Deduplicated.Inc()
	}
	b.counted(p, broker.ResultOK, at, nil)
	if p.bf != nil {
		// A past slot: the entry's own state (its last slot, its runs and
		// their outcomes) is not the backfill's.
		p.bf.published(p.slot)
		if bk.fireLog.on && bk.fireLog.allow(at, bk.cfg.FireLogLimit, broker.ResultOK, true) {
			bk.log.Info("fired", "entry", b.name, "slot", p.slot.UTC().Format(time.RFC3339Nano), "token", bk.token,
				"task_id", string(id[:]), "result", broker.ResultOK.String(), "backfill", p.bf.job.ID, "source", p.e.Source)
		}
		return false
	}
	lag := at.Sub(p.due)
	if !p.manual {
		m.FireLag.Observe(lag.Seconds())
		finished = b.advance(p)
	}
	b.recordRun(p, id, at)
	if bk.fireLog.on && bk.fireLog.allow(at, bk.cfg.FireLogLimit, broker.ResultOK, p.manual) {
		bk.log.Info("fired", "entry", b.name, "slot", p.slot.UTC().Format(time.RFC3339Nano), "token", bk.token,
			"task_id", string(id[:]), "lag", lag.String(), "result", broker.ResultOK.String(), "deduplicated", dedup, "manual", p.manual, "source", p.e.Source)
	}
	if p.req != nil {
		bk.persist.complete(*p.req, nil)
	}
	return finished
}

// advance moves the last slot to p's scheduled slot, and counts it under
// max_runs. finished: that was the entry's last run.
func (b entryBook) advance(p pendingFire) (finished bool) {
	st := b.state()
	if p.slot.After(st.LastSlot) {
		st.LastSlot = p.slot
		// A duplicate of a slot after the stored one is the previous
		// leader's unrecorded run: it counts too.
		if p.e.MaxRuns() > 0 {
			st.Runs++
			b.bk.mustFlush = true
			finished = st.Runs >= uint64(p.e.MaxRuns())
		}
	}
	st.Imported = false
	b.changed()
	return finished
}

// Failed records a fire the broker did not take (r is broker.ResultError
// or broker.ResultStale), err the publish's error. A retry that fails
// again was counted at its first failure: an outage of N slots stays N
// failed slots, not N × attempts.
func (b entryBook) Failed(p pendingFire, r broker.Result, err error, at time.Time) {
	m := b.bk.cfg.Metrics
	if r == broker.ResultError && p.failed {
		m.PublishRetries.Inc()
		m.published(b.name, "error", p.manual, at, err) // its last error, for /status
		return
	}
	b.counted(p, r, at, err)
}

// counted counts a fire's result, through the entry's cached counters (a
// label lookup per fire costs more than the rest), and tells the console.
func (b entryBook) counted(p pendingFire, r broker.Result, at time.Time, err error) {
	cfg := b.bk.cfg
	e, m := p.e, cfg.Metrics // complete synced the cached counters
	i, label := int(r), r.String()
	switch {
	case p.manual && r == broker.ResultOK:
		i, label = len(e.fires)-2, ResultManual
	case p.bf != nil && r == broker.ResultOK:
		i, label = len(e.fires)-1, ResultBackfill
	}
	if e.fires == nil {
		e.fires = new([6]*Counter)
	}
	if e.fires[i] == nil {
		e.fires[i] = m.Fires.WithLabelValues(e.Name, label)
	}
	e.fires[i].Inc()
	m.published(e.Name, label, p.manual, at, err)
	if cfg.Observer != nil {
		cfg.Observer(e.Name, p.slot, r, at.Sub(p.due), p.manual || p.bf != nil)
	}
}

// countRun counts one of the entry's runs reaching k.
func (b entryBook) countRun(k outcome.Kind) {
	e := b.e
	if e == nil {
		b.bk.cfg.Metrics.Runs.WithLabelValues(b.name, k.String()).Inc()
		return
	}
	if e.runs == nil {
		e.runs = new([outcome.NumKinds]*Counter)
	}
	if e.runs[k] == nil {
		e.runs[k] = b.bk.cfg.Metrics.Runs.WithLabelValues(e.Name, k.String())
	}
	e.runs[k].Inc()
}

// recordRun records a published fire as the entry's newest run, watched
// on the feed. A duplicate of the newest run (a re-publish after
// failover) is not a new run.
func (b entryBook) recordRun(p pendingFire, id [36]byte, at time.Time) {
	bk := b.bk
	if !bk.records(p.e, at) {
		return
	}
	st := b.state()
	if st.Out == nil {
		st.Out = &store.Outcomes{}
	}
	if n := st.Out.Newest(); n != nil && !p.manual && !n.Manual && n.Slot.Equal(p.slot) {
		return
	}
	r := outcome.Run{Slot: p.slot, Manual: p.manual, Kind: outcome.Published, PublishedAt: at, Chain: chainOf(p.e)}
	if p.manual {
		r.TaskID = string(id[:])
	}
	b.pushRun(st, r)
	bk.watchRun(b.name, &r)
	bk.unfinished[b.name] = true
	b.countRun(outcome.Published)
}

// pushRun adds r to st's runs and stops watching the run that fell off.
func (b entryBook) pushRun(st *store.EntryState, r outcome.Run) {
	if d := st.Out.Push(r); d != nil && d.Kind != outcome.Skipped && !d.Kind.Finished() {
		b.bk.unwatchRun(b.name, d)
	}
	b.changed()
}

// batchTally is what Admits has let into one batch so far: the entries
// with a fire in it under an overlap policy, and the runs counted toward
// max_runs.
type batchTally struct {
	inBatch map[string]bool
	counted map[string]uint64
}

// Admits says whether p goes out in the batch being launched. Past
// max_runs nothing more is published, however many slots a catch-up
// queued; while the entry's newest run is unfinished (or an earlier fire
// of it is in the batch) its overlap policy holds p: skip records the
// slot as skipped, buffer_one keeps one slot for when the run ends.
func (b entryBook) Admits(p pendingFire, t *batchTally, now time.Time) bool {
	if p.bf != nil {
		return true // a past slot: no run of it is in progress, and it is not counted
	}
	if p.e.MaxRuns() > 0 && !p.manual {
		st := b.state()
		if t.counted == nil {
			t.counted = map[string]uint64{}
		}
		if p.slot.After(st.LastSlot) {
			if st.Runs+t.counted[b.name] >= uint64(p.e.MaxRuns()) {
				b.bk.cfg.Metrics.Missed.WithLabelValues(b.name, ReasonMaxRuns).Inc()
				return false
			}
			t.counted[b.name]++
		}
	}
	if !b.bk.tracking() || !p.e.HoldsOverlap() || p.manual && (p.req == nil || !p.req.RespectOverlap) {
		return true
	}
	st := b.state()
	busy := t.inBatch[b.name]
	if !busy && st.Out != nil {
		busy = b.expire(st, now)
		if n := st.Out.Newest(); busy && !p.manual && !n.Manual && n.Slot.Equal(p.slot) {
			busy = false // the run itself, caught up again: the broker dedups it
		}
	}
	if !busy {
		if t.inBatch == nil {
			t.inBatch = map[string]bool{}
		}
		t.inBatch[b.name] = true
		return true
	}
	if st.Out == nil {
		st.Out = &store.Outcomes{}
	}
	if p.e.Overlap == config.OverlapBufferOne && st.Out.Buffered.IsZero() && !p.manual {
		st.Out.Buffered = p.slot
		b.changed()
		return false
	}
	b.Skipped(p, st, now)
	return false
}

// Skipped records p's slot as skipped for overlap.
func (b entryBook) Skipped(p pendingFire, st *store.EntryState, now time.Time) {
	bk := b.bk
	b.countRun(outcome.Skipped)
	bk.cfg.Metrics.Missed.WithLabelValues(b.name, ReasonOverlap).Inc()
	if p.manual {
		if p.req != nil {
			bk.persist.complete(*p.req, nil)
		}
		bk.log.Info("manual trigger skipped: the previous run is unfinished", "entry", b.name)
		return
	}
	if d := st.Out.Skip(p.slot, now); d != nil && d.Kind != outcome.Skipped && !d.Kind.Finished() {
		bk.unwatchRun(b.name, d)
	}
	b.changed()
	// A skipped slot is handled: a later leader must not catch it up.
	if p.slot.After(st.LastSlot) {
		st.LastSlot = p.slot
	}
	bk.log.Info("slot skipped: the previous run is unfinished", "entry", b.name, "slot", p.slot.UTC().Format(time.RFC3339Nano),
		"overlap", string(p.e.Overlap))
}

// Reported moves one of the entry's runs by what a worker's report about
// its task, or one of its chain's steps, says (outcome.Run.Apply: a run
// with a chain is the whole chain).
func (b entryBook) Reported(rep outcome.Report, now time.Time) {
	st := b.stored()
	if st == nil || st.Out == nil {
		return
	}
	var run *outcome.Run
	for i := range st.Out.Runs {
		r := &st.Out.Runs[i]
		if r.Kind != outcome.Skipped && rep.Step <= int(r.Chain) && b.bk.stepID(b.name, r, rep.Step) == rep.TaskID {
			run = r
			break
		}
	}
	if run == nil {
		return
	}
	at := rep.At
	if at.IsZero() {
		at = now
	}
	moved, ended := run.Apply(rep.Step, rep.Event, at)
	if !moved {
		return
	}
	b.changed()
	switch {
	case ended:
		b.bk.unwatchRun(b.name, run)
		b.ended(st, run)
	case rep.Step == 0 && !rep.Kind.Finished():
		// A chained run is received and started once, as its task is;
		// its steps' own are its progress, not more runs.
		b.countRun(rep.Kind)
	}
}

// ended applies what a run's end means for its entry: counters, the
// failure streak and pause_after_failures, and buffer_one's held slot,
// which goes back to the loop's pending.
func (b entryBook) ended(st *store.EntryState, run *outcome.Run) {
	bk, m := b.bk, b.bk.cfg.Metrics
	b.countRun(run.Kind)
	if run.Runtime > 0 {
		m.RunDuration.Observe(run.Runtime.Seconds())
	}
	o := st.Out
	at := run.Updated
	switch run.Kind {
	case outcome.Succeeded:
		o.Failures, o.LastSuccess = 0, at
	case outcome.Failed, outcome.Lost:
		o.Failures++
		o.LastFailure = at
	}
	m.outcome(b.name, o, run)
	if newest := o.Newest(); newest != run {
		return // an older run ended; the newest still decides
	}
	delete(bk.unfinished, b.name)
	e := b.e
	if e == nil {
		return
	}
	b.decided()
	if n := int(e.PauseAfterFailures); n > 0 && o.Failures >= n && !st.Paused && (run.Kind == outcome.Failed || run.Kind == outcome.Lost) {
		st.Paused = true
		o.PauseReason = pauseReason(o.Failures, run, e.Entry)
		bk.log.Warn("paused after consecutive failures", "entry", b.name, "failures", o.Failures, "reason", o.PauseReason)
		m.AutoPaused.Inc()
	}
	if !o.Buffered.IsZero() {
		slot := o.Buffered
		o.Buffered = time.Time{}
		if !st.Paused && e.Enabled {
			bk.requeue(pendingFire{e: e, slot: slot, due: slot})
		}
	}
}

// pauseReason says why failures failed runs in a row paused e, the last
// being run: its exception and, for a chain's, the step that failed.
func pauseReason(failures int, run *outcome.Run, e *config.Entry) string {
	what := run.Kind.String()
	switch {
	case run.ExcType != "" && run.ExcMsg != "":
		what = run.ExcType + ": " + run.ExcMsg
	case run.ExcType != "":
		what = run.ExcType
	}
	when := run.Slot.UTC().Format(time.RFC3339)
	if run.Chain > 0 {
		when += ", " + config.StepWords(e, int(run.Chain), int(run.Step))
	}
	return fmt.Sprintf("paused after %d consecutive failed runs; last (%s): %s", failures, when, what)
}

// decided marks the state write urgent when the end of the entry's
// newest run (finished, lost or unreported) decides what it does next: it
// frees an overlap or counts toward (or makes) a pause. Neither the
// workers' event nor beatd's own verdict comes again after a failover, so
// a next leader reading an older state would hold the entry for an
// overlap_timeout, or pause it a failure late.
func (b entryBook) decided() {
	if b.e != nil && b.e.TracksOutcomes() {
		b.bk.urgent = true
	}
}

// expire marks st's newest run lost (or unreported, when nothing has
// reported anything since it went out) once it is past its entry's
// overlap deadline, and says whether the entry still has a run out.
func (b entryBook) expire(st *store.EntryState, now time.Time) (unfinished bool) {
	bk := b.bk
	r := st.Out.Newest()
	if r == nil || r.Kind.Finished() {
		delete(bk.unfinished, b.name)
		return false
	}
	deadline := config.DefaultOverlapTimeout
	if b.e != nil {
		deadline = b.e.OverlapDeadline()
	}
	if now.Sub(r.PublishedAt) < deadline {
		return true
	}
	f := bk.cfg.Outcomes
	if !f.LastAnyReport().After(r.PublishedAt) {
		// Nothing reported anything since the run went out: beatd is
		// blind, not the worker dead. Stop blocking; count no failure.
		bk.unwatchRun(b.name, r)
		r.Kind, r.Updated = outcome.Unreported, now
		b.changed()
		b.decided()
		delete(bk.unfinished, b.name)
		b.countRun(outcome.Unreported)
		return false
	}
	bk.log.Warn("run lost: no outcome within overlap_timeout", "entry", b.name, "slot", r.Slot.UTC().Format(time.RFC3339Nano),
		"task_id", bk.runID(b.name, r), "last", r.Kind.String(), "worker", r.Worker, "overlap_timeout", deadline.String())
	bk.unwatchRun(b.name, r)
	r.Kind, r.Updated = outcome.Lost, now
	b.changed()
	b.ended(st, r)
	return false
}

// Paused pauses the entry at an admin's request, completed with the
// state that records it.
func (b entryBook) Paused(r store.Request) {
	st := b.state()
	st.Paused = true
	if r.Actor != "" || r.Note != "" {
		// Status shows who paused it and why, until a resume.
		if st.Out == nil {
			st.Out = &store.Outcomes{}
		}
		st.Out.PauseReason = manualPauseReason(r)
	}
	b.bk.persist.complete(r, st)
	b.bk.log.Info("paused", "entry", b.name)
}

// Resumed resumes the entry at an admin's request: the slots of the pause
// are not owed, even to a later leader.
func (b entryBook) Resumed(r store.Request, now time.Time) {
	st := b.state()
	st.Paused = false
	if st.Out != nil {
		// A resume starts the failure count afresh: the next failure must
		// not pause again at once.
		st.Out.PauseReason, st.Out.Failures = "", 0
	}
	st.Since = now
	if ev, ok := schedule.Base(b.e.sched).(*schedule.Every); ok {
		st.Since = ev.Prev(st.Since) // owes the same slots, keeps the grid Since anchors
	}
	b.bk.persist.complete(r, st)
	b.bk.log.Info("resumed", "entry", b.name)
}
