package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
)

// The loop's side of outcomes: a term's start puts the runs still out
// back on the feed (loadOutcomes, adoptUnrecorded); the workers' reports
// that come back are written in their entry's book (Reported), and runs
// past their overlap deadline are marked lost (expire). The publish side
// (recording a run, holding or skipping a slot under an overlap policy)
// is in book.go. All of it runs on the loop's goroutine.

// lostSweep is how often the loop looks for unfinished runs past their
// overlap deadline. Only entries with an unfinished run are looked at.
const lostSweep = time.Second

// maxReportsPerTurn bounds how many reports the loop applies before it
// looks at its slots again, so a flood of reports cannot delay a fire.
const maxReportsPerTurn = 4096

// tracking says whether the loop records outcomes at all.
func (l *loop) tracking() bool { return l.s.cfg.Outcomes != nil }

// DefaultOutcomeLive is Config.OutcomeLive's default.
const DefaultOutcomeLive = 10 * time.Minute

// records says whether a publish of e at now is recorded as a run: always
// for an entry whose scheduling depends on outcomes (overlap,
// pause_after_failures), else only while some source reports: with no
// worker sending events, recording every fire in etcd would cost each
// fire for nothing.
func (l *loop) records(e *entry, now time.Time) bool {
	if !l.tracking() {
		return false
	}
	if e.TracksOutcomes() {
		return true
	}
	live := l.s.cfg.OutcomeLive
	if live <= 0 {
		live = DefaultOutcomeLive
	}
	return l.s.cfg.Outcomes.LastAnyReport().After(now.Add(-live))
}

// runID is the task id of one of e's runs.
func (l *loop) runID(name string, r *store.Run) string {
	if r.ID != "" {
		return r.ID
	}
	id := celery.SlotIDOf(l.s.cfg.Cluster, name, r.Slot)
	return string(id[:])
}

// loadOutcomes puts the unfinished runs of the loaded state back on the
// feed at a term's start (the previous leader's runs are still running),
// and their entries' last outcomes in the metrics.
func (l *loop) loadOutcomes() {
	f := l.s.cfg.Outcomes
	if f == nil {
		return
	}
	f.Clear()
	l.books.unfinished = map[string]bool{}
	for name, st := range l.books.states {
		if st.Out == nil {
			continue
		}
		l.s.cfg.Metrics.outcome(name, st.Out, &store.Run{})
		for i := range st.Out.Runs {
			r := &st.Out.Runs[i]
			if r.Kind != outcome.Skipped && !r.Kind.Finished() {
				f.Watch(l.runID(name, r), name)
				l.books.unfinished[name] = true
			}
		}
	}
}

// adoptUnrecorded takes in the run the broker says was published last
// when the loaded state does not know it (the previous leader died
// between the publish and its state write): the slot is published, so
// the new leader neither owes it again nor counts it missed; an entry
// with max_runs counts it; and an entry whose runs are recorded gets it
// as its newest run, watched, so an outcome that came while no replica
// led still reaches it (outcome.Feed.Early) and an overlap policy does
// not publish over it. Best effort: a broker that does not answer
// leaves the state as loaded.
func (l *loop) adoptUnrecorded(ctx context.Context, now time.Time) {
	lp, ok := l.s.cfg.Dispatcher.(LastPublisher)
	if !ok {
		return
	}
	var names []string
	for _, e := range l.set.list {
		if e.HoldsOverlap() || e.MaxRuns() > 0 || l.records(e, now) {
			names = append(names, e.Name)
		}
	}
	if len(names) == 0 {
		return
	}
	last, err := lp.LastPublished(ctx, names)
	if err != nil {
		l.s.log.Warn("could not read the last published runs; overlap trusts the stored state", "err", err)
		return
	}
	for name, r := range last {
		e := l.set.get(name)
		st := l.books.state(name)
		changed := false
		if !r.Manual && r.Slot.After(st.LastSlot) {
			st.LastSlot = r.Slot
			if e.MaxRuns() > 0 {
				st.Runs++
			}
			changed = true
		}
		if (e.HoldsOverlap() || l.records(e, now)) && adoptRun(e, st, r, now) {
			changed = true
			l.s.log.Info("adopted a run the previous leader published after its last state write", "entry", name,
				"slot", r.Slot.UTC().Format(time.RFC3339Nano), "task_id", r.TaskID)
		}
		if changed {
			l.books.baseline = append(l.books.baseline, *st)
		}
	}
}

// adoptRun records r as st's newest run, in progress, unless st knows it,
// knows a newer one, or it is past its entry's overlap deadline.
func adoptRun(e *entry, st *store.EntryState, r broker.Run, now time.Time) bool {
	if st.Out == nil {
		st.Out = &store.Outcomes{}
	}
	for _, k := range st.Out.Runs {
		if k.Kind != outcome.Skipped && (r.Manual && k.ID == r.TaskID || !r.Manual && !k.Manual && k.Slot.Equal(r.Slot)) {
			return false
		}
	}
	if n := st.Out.Newest(); n != nil && !r.PublishedAt.After(n.Published) || now.Sub(r.PublishedAt) >= e.OverlapDeadline() {
		return false
	}
	run := store.Run{Slot: r.Slot, Manual: r.Manual, Kind: outcome.Published, Published: r.PublishedAt}
	if r.Manual {
		run.ID = r.TaskID
	}
	st.Out.Push(run)
	return true
}

// applyReports applies r and then whatever else the feed holds, up to
// maxReportsPerTurn, and hands the changed states to the persister.
func (l *loop) applyReports(r outcome.Report, now time.Time) {
	l.bookOf(r.Entry).Reported(r, now)
	for range maxReportsPerTurn - 1 {
		select {
		case r := <-l.reports:
			l.bookOf(r.Entry).Reported(r, now)
			continue
		default:
		}
		break
	}
	l.books.handOver(l.persist)
}

// drainReports applies what the feed holds without waiting.
func (l *loop) drainReports(now time.Time) {
	if l.reports == nil {
		return
	}
	// Reports that came before their run was watched: during a
	// leaderless gap or a handover, or before this term re-published
	// its predecessor's last slots.
	if early := l.s.cfg.Outcomes.Early(nil); len(early) > 0 {
		for _, r := range early {
			l.bookOf(r.Entry).Reported(r, now)
		}
		l.books.handOver(l.persist)
	}
	select {
	case r := <-l.reports:
		l.applyReports(r, now)
	default:
	}
}

// Reported moves one of the entry's runs to what a worker's report says
// it reached.
func (b entryBook) Reported(rep outcome.Report, now time.Time) {
	st := b.stored()
	if st == nil || st.Out == nil {
		return
	}
	var run *store.Run
	for i := range st.Out.Runs {
		r := &st.Out.Runs[i]
		if r.Kind != outcome.Skipped && b.l.runID(b.name, r) == rep.TaskID {
			run = r
			break
		}
	}
	if run == nil || !rep.Kind.Supersedes(run.Kind) {
		return
	}
	at := rep.At
	if at.IsZero() {
		at = now
	}
	run.Kind, run.Updated = rep.Kind, at
	if rep.Worker != "" {
		run.Worker = rep.Worker
	}
	if rep.Kind == outcome.Started {
		run.Started = at
	}
	if rep.Runtime > 0 {
		run.Runtime = rep.Runtime
	}
	if rep.ExcType != "" || rep.ExcMessage != "" {
		run.ExcType, run.ExcMsg = rep.ExcType, rep.ExcMessage
	}
	b.changed()
	if !rep.Kind.Finished() {
		b.countRun(rep.Kind)
	} else {
		b.l.s.cfg.Outcomes.Unwatch(rep.TaskID)
		b.ended(st, run)
	}
}

// ended applies what a run's end means for its entry: counters, the
// failure streak and pause_after_failures, and buffer_one's held slot,
// which goes back to the loop's pending.
func (b entryBook) ended(st *store.EntryState, run *store.Run) {
	l, m := b.l, b.l.s.cfg.Metrics
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
	delete(l.books.unfinished, b.name)
	e := b.e
	if e == nil {
		return
	}
	b.decided()
	if n := int(e.PauseAfterFailures); n > 0 && o.Failures >= n && !st.Paused && (run.Kind == outcome.Failed || run.Kind == outcome.Lost) {
		st.Paused = true
		o.PauseReason = pauseReason(o.Failures, run)
		l.s.log.Warn("paused after consecutive failures", "entry", b.name, "failures", o.Failures, "reason", o.PauseReason)
		m.AutoPaused.Inc()
	}
	if !o.Buffered.IsZero() {
		slot := o.Buffered
		o.Buffered = time.Time{}
		if !st.Paused && e.Enabled {
			l.queue(pendingFire{e: e, slot: slot, due: slot})
		}
	}
}

func pauseReason(failures int, run *store.Run) string {
	what := run.Kind.String()
	switch {
	case run.ExcType != "" && run.ExcMsg != "":
		what = run.ExcType + ": " + run.ExcMsg
	case run.ExcType != "":
		what = run.ExcType
	}
	return fmt.Sprintf("paused after %d consecutive failed runs; last (%s): %s", failures, run.Slot.UTC().Format(time.RFC3339), what)
}

// decided marks the state write urgent when the end of the entry's
// newest run (finished, lost or unreported) decides what it does next: it
// frees an overlap or counts toward (or makes) a pause. Neither the
// workers' event nor beatd's own verdict comes again after a failover, so
// a next leader reading an older state would hold the entry for an
// overlap_timeout, or pause it a failure late.
func (b entryBook) decided() {
	if b.e != nil && b.e.TracksOutcomes() {
		b.l.books.urgent = true
	}
}

// sweepLost marks lost the unfinished newest runs past their entry's
// overlap deadline: the worker may have died, and no report will come.
func (l *loop) sweepLost(now time.Time) {
	if now.Before(l.books.nextLostSweep) {
		return
	}
	l.books.nextLostSweep = now.Add(lostSweep)
	for name := range l.books.unfinished {
		st := l.books.states[name]
		if st == nil || st.Out == nil {
			delete(l.books.unfinished, name)
			continue
		}
		l.bookOf(name).expire(st, now)
	}
	l.books.handOver(l.persist)
}

// expire marks st's newest run lost (or unreported, when nothing has
// reported anything since it went out) once it is past its entry's
// overlap deadline, and says whether the entry still has a run out.
func (b entryBook) expire(st *store.EntryState, now time.Time) (unfinished bool) {
	l := b.l
	r := st.Out.Newest()
	if r == nil || r.Kind.Finished() {
		delete(l.books.unfinished, b.name)
		return false
	}
	deadline := config.DefaultOverlapTimeout
	if b.e != nil {
		deadline = b.e.OverlapDeadline()
	}
	if now.Sub(r.Published) < deadline {
		return true
	}
	f := l.s.cfg.Outcomes
	if !f.LastAnyReport().After(r.Published) {
		// Nothing reported anything since the run went out: beatd is
		// blind, not the worker dead. Stop blocking; count no failure.
		f.Unwatch(l.runID(b.name, r))
		r.Kind, r.Updated = outcome.Unreported, now
		b.changed()
		b.decided()
		delete(l.books.unfinished, b.name)
		b.countRun(outcome.Unreported)
		return false
	}
	l.s.log.Warn("run lost: no outcome within overlap_timeout", "entry", b.name, "slot", r.Slot.UTC().Format(time.RFC3339Nano),
		"task_id", l.runID(b.name, r), "last", r.Kind.String(), "worker", r.Worker, "overlap_timeout", deadline.String())
	f.Unwatch(l.runID(b.name, r))
	r.Kind, r.Updated = outcome.Lost, now
	b.changed()
	b.ended(st, r)
	return false
}
