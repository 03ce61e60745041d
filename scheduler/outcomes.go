package scheduler

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
)

// The loop's side of outcomes: it records each published run in the
// entry's state, watches its task id on the feed, applies the reports
// that come back, and holds or skips the slots of entries whose
// overlap policy says so. All of it runs on the loop's goroutine.

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

// countRun counts one of name's runs reaching k, through the entry's
// cached counters (a label lookup per fire costs more than the rest).
func (l *loop) countRun(name string, k outcome.Kind) {
	l.syncMetrics()
	e := l.set.get(name)
	if e == nil {
		l.s.cfg.Metrics.Runs.WithLabelValues(name, k.String()).Inc()
		return
	}
	l.countEntryRun(e, k)
}

// countEntryRun is countRun for a caller that holds the entry (a fire):
// the set's search by name costs a binary search at scale.
func (l *loop) countEntryRun(e *entry, k outcome.Kind) {
	l.syncMetrics()
	if e.runs == nil {
		e.runs = new([outcome.NumKinds]*Counter)
	}
	if e.runs[k] == nil {
		e.runs[k] = l.s.cfg.Metrics.Runs.WithLabelValues(e.Name, k.String())
	}
	e.runs[k].Inc()
}

// runID is the task id of one of e's runs.
func (l *loop) runID(name string, r *outcome.Run) string {
	if r.TaskID != "" {
		return r.TaskID
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
	l.unfinished = map[string]bool{}
	for name, st := range l.states {
		if st.Out == nil {
			continue
		}
		l.s.cfg.Metrics.outcome(name, st.Out, &outcome.Run{})
		for i := range st.Out.Runs {
			r := &st.Out.Runs[i]
			if r.Kind != outcome.Skipped && !r.Kind.Finished() {
				f.Watch(l.runID(name, r), name)
				l.unfinished[name] = true
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
		st := l.state(name)
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
			l.baseline = append(l.baseline, *st)
		}
	}
}

// adoptRun records r as st's newest run, in progress, unless st knows it,
// knows a newer one, or it is past its entry's overlap deadline.
func adoptRun(e *entry, st *store.EntryState, r outcome.Run, now time.Time) bool {
	if st.Out == nil {
		st.Out = &store.Outcomes{}
	}
	for _, k := range st.Out.Runs {
		if k.Kind != outcome.Skipped && (r.Manual && k.TaskID == r.TaskID || !r.Manual && !k.Manual && k.Slot.Equal(r.Slot)) {
			return false
		}
	}
	if n := st.Out.Newest(); n != nil && !r.PublishedAt.After(n.PublishedAt) || now.Sub(r.PublishedAt) >= e.OverlapDeadline() {
		return false
	}
	run := outcome.Run{Slot: r.Slot, Manual: r.Manual, Kind: outcome.Published, PublishedAt: r.PublishedAt}
	if r.Manual {
		run.TaskID = r.TaskID
	}
	st.Out.Push(run)
	return true
}

// recordPublished records a published fire as the entry's newest run.
// A duplicate of the newest run (a re-publish after failover) is not a
// new run.
func (l *loop) recordPublished(p pendingFire, id [36]byte, now time.Time) {
	if !l.records(p.e, now) {
		return
	}
	st := l.state(p.e.Name)
	if st.Out == nil {
		st.Out = &store.Outcomes{}
	}
	if n := st.Out.Newest(); n != nil && !p.manual && !n.Manual && n.Slot.Equal(p.slot) {
		return
	}
	r := outcome.Run{Slot: p.slot, Manual: p.manual, Kind: outcome.Published, PublishedAt: now}
	if p.manual {
		r.TaskID = string(id[:])
	}
	l.pushRun(p.e.Name, st, r)
	l.s.cfg.Outcomes.Watch(string(id[:]), p.e.Name)
	l.unfinished[p.e.Name] = true
	l.countEntryRun(p.e, outcome.Published)
}

// pushRun adds r to st's runs and stops watching the run that fell off.
func (l *loop) pushRun(name string, st *store.EntryState, r outcome.Run) {
	if d := st.Out.Push(r); d != nil && d.Kind != outcome.Skipped && !d.Kind.Finished() {
		l.s.cfg.Outcomes.Unwatch(l.runID(name, d))
	}
	l.dirty[name] = true
}

// applyReports applies r and then whatever else the feed holds, up to
// maxReportsPerTurn, and hands the changed states to the persister.
func (l *loop) applyReports(r outcome.Report, now time.Time) {
	l.applyReport(r, now)
	for range maxReportsPerTurn - 1 {
		select {
		case r := <-l.reports:
			l.applyReport(r, now)
			continue
		default:
		}
		break
	}
	l.saveDirty()
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
			l.applyReport(r, now)
		}
		l.saveDirty()
	}
	select {
	case r := <-l.reports:
		l.applyReports(r, now)
	default:
	}
}

// applyReport moves one run to what the report says it reached.
func (l *loop) applyReport(rep outcome.Report, now time.Time) {
	st := l.states[rep.Entry]
	if st == nil || st.Out == nil {
		return
	}
	var run *outcome.Run
	for i := range st.Out.Runs {
		r := &st.Out.Runs[i]
		if r.Kind != outcome.Skipped && l.runID(rep.Entry, r) == rep.TaskID {
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
	l.dirty[rep.Entry] = true
	if !rep.Kind.Finished() {
		l.countRun(rep.Entry, rep.Kind)
	} else {
		l.s.cfg.Outcomes.Unwatch(rep.TaskID)
		l.finished(rep.Entry, st, run, now)
	}
}

// finished applies what a run's end means for its entry: counters, the
// failure streak and pause_after_failures, and buffer_one's held slot.
func (l *loop) finished(name string, st *store.EntryState, run *outcome.Run, now time.Time) {
	m := l.s.cfg.Metrics
	l.countRun(name, run.Kind)
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
	m.outcome(name, o, run)
	if newest := o.Newest(); newest != run {
		return // an older run ended; the newest still decides
	}
	delete(l.unfinished, name)
	e := l.set.get(name)
	if e == nil {
		return
	}
	l.runEnded(e)
	if n := int(e.PauseAfterFailures); n > 0 && o.Failures >= n && !st.Paused && (run.Kind == outcome.Failed || run.Kind == outcome.Lost) {
		st.Paused = true
		o.PauseReason = pauseReason(o.Failures, run)
		l.s.log.Warn("paused after consecutive failures", "entry", name, "failures", o.Failures, "reason", o.PauseReason)
		m.AutoPaused.Inc()
	}
	if !o.Buffered.IsZero() {
		slot := o.Buffered
		o.Buffered = time.Time{}
		if !st.Paused && e.Enabled {
			l.pending = append(l.pending, pendingFire{e: e, slot: slot, due: slot})
			m.queued(name, slot)
		}
	}
}

func pauseReason(failures int, run *outcome.Run) string {
	what := run.Kind.String()
	switch {
	case run.ExcType != "" && run.ExcMsg != "":
		what = run.ExcType + ": " + run.ExcMsg
	case run.ExcType != "":
		what = run.ExcType
	}
	return fmt.Sprintf("paused after %d consecutive failed runs; last (%s): %s", failures, run.Slot.UTC().Format(time.RFC3339), what)
}

// runEnded marks the state write urgent when the end of e's newest run
// (finished, lost or unreported) decides what e does next: it frees an
// overlap or counts toward (or makes) a pause. Neither the workers' event
// nor beatd's own verdict comes again after a failover, so a next leader
// reading an older state would hold the entry for an overlap_timeout, or
// pause it a failure late.
func (l *loop) runEnded(e *entry) {
	if e.TracksOutcomes() {
		l.urgent = true
	}
}

// sweepLost marks lost the unfinished newest runs past their entry's
// overlap deadline: the worker may have died, and no report will come.
func (l *loop) sweepLost(now time.Time) {
	if now.Before(l.nextLostSweep) {
		return
	}
	l.nextLostSweep = now.Add(lostSweep)
	for name := range l.unfinished {
		st := l.states[name]
		if st == nil || st.Out == nil {
			delete(l.unfinished, name)
			continue
		}
		l.expireRun(name, st, now)
	}
	l.saveDirty()
}

// expireRun marks st's newest run lost if it is past its deadline, and
// says whether the entry still has an unfinished run.
func (l *loop) expireRun(name string, st *store.EntryState, now time.Time) (unfinished bool) {
	r := st.Out.Newest()
	if r == nil || r.Kind.Finished() {
		delete(l.unfinished, name)
		return false
	}
	deadline := config.DefaultOverlapTimeout
	if e := l.set.get(name); e != nil {
		deadline = e.OverlapDeadline()
	}
	if now.Sub(r.PublishedAt) < deadline {
		return true
	}
	f := l.s.cfg.Outcomes
	if !f.LastAnyReport().After(r.PublishedAt) {
		// Nothing reported anything since the run went out: beatd is
		// blind, not the worker dead. Stop blocking; count no failure.
		f.Unwatch(l.runID(name, r))
		r.Kind, r.Updated = outcome.Unreported, now
		l.dirty[name] = true
		if e := l.set.get(name); e != nil {
			l.runEnded(e)
		}
		delete(l.unfinished, name)
		l.countRun(name, outcome.Unreported)
		return false
	}
	l.s.log.Warn("run lost: no outcome within overlap_timeout", "entry", name, "slot", r.Slot.UTC().Format(time.RFC3339Nano),
		"task_id", l.runID(name, r), "last", r.Kind.String(), "worker", r.Worker, "overlap_timeout", deadline.String())
	l.s.cfg.Outcomes.Unwatch(l.runID(name, r))
	r.Kind, r.Updated = outcome.Lost, now
	l.dirty[name] = true
	l.finished(name, st, r, now)
	return false
}

// holdOverlapping takes out of batch the fires that their entry's
// overlap policy holds back: while the entry's newest run is unfinished
// (or an earlier fire of it is in the batch), skip records the slot as
// skipped and buffer_one keeps one slot for when the run ends. The rest
// are returned, in order.
func (l *loop) holdOverlapping(batch []pendingFire, now time.Time) []pendingFire {
	kept := batch[:0]
	var inBatch map[string]bool
	var counted map[string]uint64
	for _, p := range batch {
		if p.bf != nil {
			kept = append(kept, p) // a past slot: no run of it is in progress, and it is not counted
			continue
		}
		if p.e.MaxRuns() > 0 && !p.manual {
			// Past max_runs nothing more is published, however many slots
			// a catch-up queued.
			st := l.state(p.e.Name)
			if counted == nil {
				counted = map[string]uint64{}
			}
			if p.slot.After(st.LastSlot) {
				if st.Runs+counted[p.e.Name] >= uint64(p.e.MaxRuns()) {
					l.s.cfg.Metrics.Missed.WithLabelValues(p.e.Name, ReasonMaxRuns).Inc()
					continue
				}
				counted[p.e.Name]++
			}
		}
		if !l.tracking() {
			kept = append(kept, p)
			continue
		}
		pol := p.e.Overlap
		if !p.e.HoldsOverlap() || p.manual && (p.req == nil || !p.req.RespectOverlap) {
			kept = append(kept, p)
			continue
		}
		st := l.state(p.e.Name)
		busy := inBatch[p.e.Name]
		if !busy && st.Out != nil {
			busy = l.expireRun(p.e.Name, st, now)
			if n := st.Out.Newest(); busy && !p.manual && !n.Manual && n.Slot.Equal(p.slot) {
				busy = false // the run itself, caught up again: the broker dedups it
			}
		}
		if !busy {
			if inBatch == nil {
				inBatch = map[string]bool{}
			}
			inBatch[p.e.Name] = true
			kept = append(kept, p)
			continue
		}
		if st.Out == nil {
			st.Out = &store.Outcomes{}
		}
		if pol == config.OverlapBufferOne && st.Out.Buffered.IsZero() && !p.manual {
			st.Out.Buffered = p.slot
			l.dirty[p.e.Name] = true
			continue
		}
		l.skipOverlap(p, st, now)
	}
	return kept
}

// skipOverlap records p's slot as skipped for overlap.
func (l *loop) skipOverlap(p pendingFire, st *store.EntryState, now time.Time) {
	m := l.s.cfg.Metrics
	l.countEntryRun(p.e, outcome.Skipped)
	m.Missed.WithLabelValues(p.e.Name, ReasonOverlap).Inc()
	if p.manual {
		if p.req != nil {
			l.persist.complete(*p.req, nil)
		}
		l.s.log.Info("manual trigger skipped: the previous run is unfinished", "entry", p.e.Name)
		return
	}
	if d := st.Out.Skip(p.slot, now); d != nil && d.Kind != outcome.Skipped && !d.Kind.Finished() {
		l.s.cfg.Outcomes.Unwatch(l.runID(p.e.Name, d))
	}
	l.dirty[p.e.Name] = true
	// A skipped slot is handled: a later leader must not catch it up.
	if p.slot.After(st.LastSlot) {
		st.LastSlot = p.slot
	}
	l.s.log.Info("slot skipped: the previous run is unfinished", "entry", p.e.Name, "slot", p.slot.UTC().Format(time.RFC3339Nano),
		"overlap", string(p.e.Overlap))
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

// saveDirty hands the states changed since the last save to the
// persister.
func (l *loop) saveDirty() {
	if len(l.dirty) == 0 {
		return
	}
	l.changed = l.changed[:0]
	for name := range l.dirty {
		if st := l.states[name]; st != nil {
			l.changed = append(l.changed, *st)
		}
	}
	clear(l.dirty)
	if l.urgent {
		l.urgent = false
		l.persist.saveNow(l.changed...)
	} else {
		l.persist.save(l.changed...)
	}
}
