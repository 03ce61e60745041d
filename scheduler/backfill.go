package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
)

// Backfill limits, stated in the CLI's help and the API's errors.
const (
	// MaxBackfillSlots is the most slots one backfill publishes: a range
	// wider than that is refused, not cut short.
	MaxBackfillSlots = 10000
	// DefaultBackfillRate paces a backfill that names no rate: slow
	// enough not to flood the workers, fast enough for a day of minutes.
	DefaultBackfillRate = 10.0
	// MaxBackfillRate is the fastest a backfill goes.
	MaxBackfillRate = 1000.0
)

// BackfillSlot is one slot of a backfill's plan.
type BackfillSlot struct {
	Slot   time.Time `json:"slot"`
	TaskID string    `json:"task_id"` // what a normal fire of the slot was, or would have been, named
	// Fired: the run history shows the slot as already published (a
	// backfill skips it unless told to include it).
	Fired bool `json:"fired,omitempty"`
}

// BackfillInput is what a backfill's plan is made from.
type BackfillInput struct {
	Entry *config.Entry
	State *store.EntryState // nil: the entry has none yet
	// History is the broker's record of the entry's recent runs (Redis
	// keeps the last --run-history; RabbitMQ none).
	History []broker.Run
	// Jobs are the backfills on record (the last store.KeptBackfills
	// finished, and the unfinished).
	Jobs     []store.Backfill
	From, To time.Time
	Now      time.Time
	Cluster  string
}

// ErrBackfillRange is a backfill range that is refused; the error is a
// *RangeError.
var ErrBackfillRange = errors.New("backfill range")

// RangeError says why a backfill range is refused, and which of its
// fields is at fault ("from", "to", or "" for the range as a whole).
type RangeError struct {
	Field string
	Msg   string
}

func (e *RangeError) Error() string        { return e.Msg }
func (e *RangeError) Is(target error) bool { return target == ErrBackfillRange }

func rangeErr(field, format string, args ...any) error {
	return &RangeError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// CheckBackfillRange refuses a range that is reversed or in the future.
func CheckBackfillRange(from, to, now time.Time) error {
	switch {
	case from.IsZero() || to.IsZero():
		return rangeErr("", "from and to are both required")
	case !to.After(from):
		return rangeErr("to", "to (%s) must be after from (%s)", to.Format(time.RFC3339), from.Format(time.RFC3339))
	case to.After(now):
		return rangeErr("to", "to (%s) is in the future; the schedule itself fires what is to come", to.Format(time.RFC3339))
	}
	return nil
}

// PlanBackfill lists the entry's slots in [From, To], in order, each
// with its task id and whether it already fired. "Already fired" sees
// the broker's run history (the last --run-history runs), the runs kept
// with the entry's state, and the backfills on record: it is bounded,
// and a slot fired before all of them counts as not fired. A range of
// more than MaxBackfillSlots slots is refused.
func PlanBackfill(in BackfillInput) ([]BackfillSlot, error) {
	if err := CheckBackfillRange(in.From, in.To, in.Now); err != nil {
		return nil, err
	}
	sched, err := backfillSchedule(in.Entry, in.State, in.From, in.Now)
	if err != nil {
		return nil, err
	}
	fired := firedSlots(in)
	var out []BackfillSlot
	for t := in.From.Add(-time.Nanosecond); ; {
		s := sched.Next(t)
		if s.IsZero() || s.After(in.To) {
			break
		}
		if len(out) == MaxBackfillSlots {
			return nil, rangeErr("", "more than %d slots from %s to %s (a backfill publishes at most %d); backfill a narrower range",
				MaxBackfillSlots, in.From.Format(time.RFC3339), in.To.Format(time.RFC3339), MaxBackfillSlots)
		}
		id := celery.SlotIDOf(in.Cluster, in.Entry.Name, s)
		out = append(out, BackfillSlot{Slot: s, TaskID: string(id[:]), Fired: fired(s)})
		t = s
	}
	return out, nil
}

// backfillSchedule is e's schedule over the past, as the leader ran (or
// would have run) it: the same grid, exclusions and end_at, but not
// max_runs, which counts scheduled runs only. An interval's grid runs on
// back before the point it is anchored at.
func backfillSchedule(e *config.Entry, st *store.EntryState, from, now time.Time) (schedule.Schedule, error) {
	s := schedule.Anchor(e.Schedule, anchorOf(st, now))
	if ev, ok := s.(*schedule.Every); ok {
		if ev.Relative {
			return nil, rangeErr("", "%q runs relative to its last run, so it has no slots to backfill", e.Name)
		}
		if a := ev.Anchor; !a.IsZero() && from.Before(a) {
			c := *ev
			k := int64(math.Ceil(float64(a.Sub(from)) / float64(ev.Interval)))
			c.Anchor = a.Add(-time.Duration(k) * ev.Interval)
			s = &c
		}
	}
	return bounded(e, s), nil
}

// anchorOf is where an interval without start_at is anchored: see
// Anchored.
func anchorOf(st *store.EntryState, now time.Time) time.Time {
	switch {
	case st != nil && !st.Since.IsZero():
		return st.Since
	case st != nil && !st.LastSlot.IsZero():
		return st.LastSlot
	}
	return now
}

// firedSlots says whether a slot already fired, from what is on record.
func firedSlots(in BackfillInput) func(time.Time) bool {
	seen := map[int64]bool{}
	for _, r := range in.History {
		if !r.Manual || r.Backfill {
			seen[r.Slot.UnixNano()] = true
		}
	}
	if in.State != nil && in.State.Out != nil {
		for _, r := range in.State.Out.Runs {
			if !r.Manual && r.Kind != outcome.Skipped {
				seen[r.Slot.UnixNano()] = true
			}
		}
	}
	var jobs []*store.Backfill
	for i := range in.Jobs {
		if j := &in.Jobs[i]; j.Entry == in.Entry.Name {
			jobs = append(jobs, j)
		}
	}
	return func(s time.Time) bool {
		if seen[s.UnixNano()] {
			return true
		}
		for _, j := range jobs {
			if j.Covers(s) {
				return true
			}
		}
		return false
	}
}

// BackfillStore is the Store a leader runs backfills with.
type BackfillStore interface {
	Backfill(ctx context.Context, id string) (store.Backfill, bool, error)
	Backfills(ctx context.Context) ([]store.Backfill, error)
	SaveBackfill(ctx context.Context, g election.Fence, b *store.Backfill, also ...string) error
	TrimBackfills(ctx context.Context, g election.Fence) error
}

// RunHistory is a Dispatcher that keeps each entry's recent runs (Redis).
type RunHistory interface {
	Runs(ctx context.Context, entry string) ([]broker.Run, error)
}

// BackfillEnder is a Dispatcher that keeps a cursor per running backfill
// (Redis) and drops it when the backfill ends.
type BackfillEnder interface {
	EndBackfill(ctx context.Context, token int64, id string) error
}

// backfills are the backfills a term runs.
type backfills struct {
	running map[string]*backfillRun // by id
	retry   []store.Request         // requests whose start failed, retried
	wait    time.Duration           // when they next need the loop (0: they do not)
}

// backfillRun is a backfill the term is running.
type backfillRun struct {
	job    store.Backfill
	reqKey string
	e      *entry
	todo   []BackfillSlot // still to publish or skip, in order
	// Pacing: the slots published since origin, at job.Rate a second.
	origin   time.Time
	paced    int
	inflight int // fires in l.pending
	savedAt  time.Time
	dirty    bool
}

// backfillSave is the most often a running backfill's progress is
// written: a new leader resumes from it, and the broker's cursor makes
// what was published since a duplicate.
const backfillSave = time.Second

// backfillIO bounds each etcd or broker call a backfill makes.
const backfillIO = 2 * time.Second

func (l *loop) backfillStore() BackfillStore {
	bs, _ := l.s.cfg.Store.(BackfillStore)
	return bs
}

// startBackfill runs the job a backfill request names, or resumes it
// after a failover from its saved cursor. ok is false when it could not
// be read (it is retried).
func (l *loop) startBackfill(ctx context.Context, r store.Request, now time.Time) (ok bool) {
	bs := l.backfillStore()
	if bs == nil {
		l.persist.complete(r, nil)
		return true
	}
	if l.bf.running == nil {
		l.bf.running = map[string]*backfillRun{}
	}
	if l.bf.running[r.Backfill] != nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, backfillIO)
	defer cancel()
	job, found, err := bs.Backfill(ctx, r.Backfill)
	if err != nil {
		l.s.log.Warn("backfill not started: its job could not be read", "backfill", r.Backfill, "err", err)
		return false
	}
	if !found || !job.Unfinished() {
		l.persist.complete(r, nil) // gone, or final: nothing to run
		return true
	}
	run := &backfillRun{job: job, reqKey: r.Key, origin: now, savedAt: now}
	e := l.set.get(job.Entry)
	if e == nil {
		l.endBackfill(ctx, run, store.BackfillInterrupted, "the entry is not in the config", now)
		return true
	}
	run.e = e
	hist, others, ok := l.backfillRecord(ctx, bs, job)
	if !ok {
		return false
	}
	from := job.From
	if !job.Cursor.IsZero() {
		from = job.Cursor.Add(time.Nanosecond)
	}
	var plan []BackfillSlot
	if !from.After(job.To) {
		plan, err = PlanBackfill(BackfillInput{Entry: e.Entry, State: l.books.states[e.Name], History: hist, Jobs: others,
			From: from, To: job.To, Now: now, Cluster: l.s.cfg.Cluster})
	}
	if err != nil {
		l.endBackfill(ctx, run, store.BackfillInterrupted, err.Error(), now)
		return true
	}
	// Slots the schedule still owes (due now, or queued by a catch-up)
	// are its to publish, not the backfill's.
	owned := l.ownedFrom(e.Name)
	for i, s := range plan {
		if !owned.IsZero() && !s.Slot.Before(owned) {
			plan = plan[:i]
			break
		}
	}
	run.todo = plan
	if job.State == store.BackfillQueued {
		run.job.Started = now
		run.job.Total = len(plan)
	}
	run.job.State, run.job.Token = store.BackfillRunning, l.term.Token
	if err := bs.SaveBackfill(ctx, l.guard, &run.job); err != nil {
		if errors.Is(err, store.ErrNotLeader) {
			return true // the term is ending; the next leader starts it
		}
		l.s.log.Warn("backfill not started: its start could not be written", "backfill", job.ID, "err", err)
		return false
	}
	l.bf.running[job.ID] = run
	l.s.log.Info("backfill running", "backfill", job.ID, "entry", job.Entry, "slots", len(plan),
		"from", from.UTC().Format(time.RFC3339), "to", job.To.UTC().Format(time.RFC3339), "rate", job.Rate, "resumed", !job.Cursor.IsZero())
	return true
}

// backfillRecord reads what is on record for job's plan: the entry's run
// history and the other backfills. ok is false when a read failed (the
// start is retried).
func (l *loop) backfillRecord(ctx context.Context, bs BackfillStore, job store.Backfill) (hist []broker.Run, others []store.Backfill, ok bool) {
	jobs, err := bs.Backfills(ctx)
	if err != nil {
		l.s.log.Warn("backfill not started: the backfills on record could not be read", "backfill", job.ID, "err", err)
		return nil, nil, false
	}
	if h, ok := l.s.cfg.Dispatcher.(RunHistory); ok {
		if hist, err = h.Runs(ctx, job.Entry); err != nil {
			l.s.log.Warn("backfill not started: the run history could not be read", "backfill", job.ID, "err", err)
			return nil, nil, false
		}
	}
	// The job's own progress is its cursor, not "already fired".
	others = jobs[:0]
	for _, j := range jobs {
		if j.ID != job.ID {
			others = append(others, j)
		}
	}
	if !job.Cursor.IsZero() {
		// Resumed: the slots this job published after its saved cursor
		// are in the history too, but they are its own (the broker's
		// cursor makes them duplicates, counted as published); another
		// backfill's are covered by that job's record.
		own := hist[:0:0]
		for _, r := range hist {
			if !r.Backfill {
				own = append(own, r)
			}
		}
		hist = own
	}
	return hist, others, true
}

// ownedFrom is the earliest slot of the entry the schedule itself will
// publish: its next slot, or a pending (catch-up) one. Zero: none.
func (l *loop) ownedFrom(name string) time.Time {
	var t time.Time
	if e := l.set.get(name); e != nil && e.it != nil {
		t = e.it.slot
	}
	for _, p := range l.pending {
		if p.e.Name == name && !p.manual && p.bf == nil && (t.IsZero() || p.slot.Before(t)) {
			t = p.slot
		}
	}
	return t
}

// feedBackfills hands each running backfill's next slots to pending, as
// its rate allows, skipping those already fired, and ends the backfills
// with nothing left. It returns how long until the next slot is due (0:
// none waits).
func (l *loop) feedBackfills(ctx context.Context, now time.Time) (wait time.Duration) {
	for _, id := range l.bf.retry {
		if l.startBackfill(ctx, id, now) {
			l.bf.retry = l.bf.retry[1:]
		} else {
			break
		}
	}
	if len(l.bf.retry) > 0 {
		wait = time.Second
	}
	for id, run := range l.bf.running {
		for len(run.todo) > 0 && run.inflight < l.s.cfg.BatchSize {
			s := run.todo[0]
			if s.Fired && !run.job.IncludeFired {
				if run.inflight > 0 {
					break // the cursor moves in order: after the fires ahead
				}
				run.todo = run.todo[1:]
				run.job.Skipped++
				run.job.Cursor, run.dirty = s.Slot, true
				continue
			}
			allowed := int(now.Sub(run.origin).Seconds()*run.job.Rate) + 1
			if run.paced >= allowed {
				next := run.origin.Add(time.Duration(float64(run.paced) / run.job.Rate * float64(time.Second)))
				if d := max(next.Sub(now), time.Millisecond); wait == 0 || d < wait {
					wait = d
				}
				break
			}
			run.todo = run.todo[1:]
			run.paced++
			run.inflight++
			l.pending = append(l.pending, pendingFire{e: run.e, slot: s.Slot, due: now, bf: run})
		}
		if len(run.todo) == 0 && run.inflight == 0 {
			l.endBackfill(ctx, run, store.BackfillDone, "", now)
			delete(l.bf.running, id)
			continue
		}
		if run.dirty && now.Sub(run.savedAt) >= backfillSave {
			l.saveBackfill(ctx, run, now)
		}
	}
	return wait
}

// published counts a fire of the backfill the broker took (or had
// taken: a duplicate is one a previous term of the job published).
func (run *backfillRun) published(slot time.Time) {
	run.inflight--
	run.job.Published++
	run.job.Cursor, run.dirty = slot, true
}

func (l *loop) saveBackfill(ctx context.Context, run *backfillRun, now time.Time, also ...string) bool {
	bs := l.backfillStore()
	ctx, cancel := context.WithTimeout(ctx, backfillIO)
	defer cancel()
	if err := bs.SaveBackfill(ctx, l.guard, &run.job, also...); err != nil {
		if !errors.Is(err, store.ErrNotLeader) {
			l.s.log.Warn("backfill progress not written; retried", "backfill", run.job.ID, "err", err)
		}
		return false
	}
	run.savedAt, run.dirty = now, false
	return true
}

// endBackfill writes a job's final state, completes its request in the
// same transaction, and drops the broker's cursor.
func (l *loop) endBackfill(ctx context.Context, run *backfillRun, state, why string, now time.Time) {
	run.job.State, run.job.Error, run.job.Finished = state, why, now
	if !l.saveBackfill(context.WithoutCancel(ctx), run, now, run.reqKey) {
		// Left unfinished in etcd: the next term (or this one, on the
		// request's next listing) ends it.
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backfillIO)
	defer cancel()
	if be, ok := l.s.cfg.Dispatcher.(BackfillEnder); ok {
		if err := be.EndBackfill(ctx, l.term.Token, run.job.ID); err != nil {
			l.s.log.Warn("backfill's broker cursor not dropped (it expires)", "backfill", run.job.ID, "err", err)
		}
	}
	_ = l.backfillStore().TrimBackfills(ctx, l.guard)
	l.s.log.Info("backfill "+state, "backfill", run.job.ID, "entry", run.job.Entry, "published", run.job.Published,
		"skipped", run.job.Skipped, "total", run.job.Total, "why", why)
}

// cancelBackfill stops a backfill: its fires not yet published are
// dropped, and it ends as cancelled with what it did.
func (l *loop) cancelBackfill(ctx context.Context, r store.Request, pending []store.Request, now time.Time) {
	defer l.persist.complete(r, nil)
	run := l.bf.running[r.Backfill]
	if run == nil {
		// Not running in this term: end it from its record.
		bs := l.backfillStore()
		if bs == nil {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, backfillIO)
		job, found, err := bs.Backfill(cctx, r.Backfill)
		cancel()
		if err != nil || !found || !job.Unfinished() {
			return
		}
		run = &backfillRun{job: job}
		for _, q := range pending {
			if q.Op == store.OpBackfill && q.Backfill == job.ID {
				run.reqKey = q.Key
			}
		}
	} else {
		kept := l.pending[:0]
		for _, p := range l.pending {
			if p.bf != run {
				kept = append(kept, p)
			}
		}
		l.pending = kept
		delete(l.bf.running, r.Backfill)
	}
	why := "cancelled"
	if r.Actor != "" {
		why += " by " + r.Actor
	}
	if r.Note != "" {
		why += ": " + r.Note
	}
	l.endBackfill(ctx, run, store.BackfillCancelled, why, now)
}

// reloadBackfills points running backfills at their entry's new
// definition, and interrupts those whose entry left the config.
func (l *loop) reloadBackfills(ctx context.Context, now time.Time) {
	for id, run := range l.bf.running {
		e := l.set.get(run.job.Entry)
		if e == nil {
			l.endBackfill(ctx, run, store.BackfillInterrupted, "the entry left the config", now)
			delete(l.bf.running, id)
			continue
		}
		run.e = e
	}
}
