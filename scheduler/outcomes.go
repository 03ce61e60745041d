package scheduler

import (
	"context"
	"time"

	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
)

// The loop's side of outcomes, besides each entry's book: a term's start
// puts the runs still out back on the feed (loadOutcomes, adoptUnrecorded),
// the workers' reports are handed to their entry's book (applyReports,
// drainReports), and the runs past their overlap deadline are looked for
// (sweepLost). All of it runs on the loop's goroutine.

// lostSweep is how often the loop looks for unfinished runs past their
// overlap deadline. Only entries with an unfinished run are looked at.
const lostSweep = time.Second

// maxReportsPerTurn bounds how many reports the loop applies before it
// looks at its slots again, so a flood of reports cannot delay a fire.
const maxReportsPerTurn = 4096

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
		l.s.cfg.Metrics.outcome(name, st.Out, &outcome.Run{})
		for i := range st.Out.Runs {
			r := &st.Out.Runs[i]
			if r.Kind != outcome.Skipped && !r.Kind.Finished() {
				l.books.watchRun(name, r)
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
		if e.HoldsOverlap() || e.MaxRuns() > 0 || l.books.records(e, now) {
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
		if (e.HoldsOverlap() || l.books.records(e, now)) && adoptRun(e, st, r, now) {
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
	run := outcome.Run{Slot: r.Slot, Manual: r.Manual, Kind: outcome.Published, PublishedAt: r.PublishedAt, Chain: chainOf(e)}
	if r.Manual {
		run.TaskID = r.TaskID
	}
	st.Out.Push(run)
	return true
}

// applyReports applies r and then whatever else the feed holds, up to
// maxReportsPerTurn, and hands the changed states to the persister.
func (l *loop) applyReports(r outcome.Report, now time.Time) {
	l.syncMetrics()
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
	l.books.handOver()
	l.queueHeld()
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
		l.syncMetrics()
		for _, r := range early {
			l.bookOf(r.Entry).Reported(r, now)
		}
		l.books.handOver()
		l.queueHeld()
	}
	select {
	case r := <-l.reports:
		l.applyReports(r, now)
	default:
	}
}

// sweepLost marks lost the unfinished newest runs past their entry's
// overlap deadline: the worker may have died, and no report will come.
func (l *loop) sweepLost(now time.Time) {
	if now.Before(l.books.nextLostSweep) {
		return
	}
	l.books.nextLostSweep = now.Add(lostSweep)
	l.syncMetrics()
	for name := range l.books.unfinished {
		st := l.books.states[name]
		if st == nil || st.Out == nil {
			delete(l.books.unfinished, name)
			continue
		}
		l.bookOf(name).expire(st, now)
	}
	l.books.handOver()
	l.queueHeld()
}
