package upcoming

import (
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
)

// Anchored is e's schedule as the leader runs it. An interval without
// start_at or relative runs on a grid anchored where its schedule began:
// the state's Since, so every replica agrees; state written before Since
// existed keeps its last slot's phase; an entry with no state is anchored
// at now, where a leader would first schedule it.
func Anchored(e *config.Entry, st *store.EntryState, now time.Time) schedule.Schedule {
	since := now
	if st != nil && !st.Since.IsZero() {
		since = st.Since
	} else if st != nil && !st.LastSlot.IsZero() {
		since = st.LastSlot
	}
	if RunsLeft(e, st) == 0 {
		return schedule.Never{} // it has made its max_runs
	}
	return Bounded(e, schedule.Anchor(e.Schedule, since))
}

// Bounded wraps s in e's exclusions and end_at.
func Bounded(e *config.Entry, s schedule.Schedule) schedule.Schedule {
	if len(e.Exclude()) > 0 {
		s = &schedule.Except{Schedule: s, Excluded: e.Excluded}
	}
	if end := e.EndAt(); !end.IsZero() {
		s = &schedule.Until{Schedule: s, End: end}
	}
	return s
}

// Finished says e will not fire again because it reached its end_at or
// made its max_runs (not because it is disabled or paused), and how many
// runs it has left (-1: no max_runs).
func Finished(e *config.Entry, st *store.EntryState, now time.Time) (finished bool, remaining int) {
	remaining = RunsLeft(e, st)
	return remaining == 0 || !e.EndAt().IsZero() && Anchored(e, st, now).Next(now).IsZero(), remaining
}

// RunsLeft is how many more slots e fires before it has made its
// max_runs, by the runs st counts (the leader's count, persisted with
// each fire), or -1 when e has no max_runs.
func RunsLeft(e *config.Entry, st *store.EntryState) int {
	most := e.MaxRuns()
	if most <= 0 {
		return -1
	}
	if st == nil {
		return most
	}
	return max(most-int(min(st.Runs, uint64(most))), 0)
}

// Slots is the next (at most) n slots after now that e fires, as the
// leader decides: its anchored schedule, bounded by end_at and its
// calendars (Anchored), and no more of them than its max_runs leaves
// (RunsLeft). Whether e is enabled or paused is the caller's to say
// (Next folds it in). `beatd next`, the entries API and the console
// list upcoming slots with it.
func Slots(e *config.Entry, st *store.EntryState, now time.Time, n int) []time.Time {
	if left := RunsLeft(e, st); left >= 0 && left < n {
		n = left
	}
	if n <= 0 {
		return nil
	}
	out := make([]time.Time, 0, n)
	s, t := Anchored(e, st, now), now
	for range n {
		if t = s.Next(t); t.IsZero() {
			break
		}
		out = append(out, t)
	}
	return out
}

// Next is the one answer to "when does e fire next, after now": the
// next slot of its anchored schedule, or zero when it is disabled,
// paused or has no slot left. The leader, /status, the console and
// `beatd next` all ask it.
func Next(e *config.Entry, st *store.EntryState, now time.Time) time.Time {
	if !e.Enabled || (st != nil && st.Paused) {
		return time.Time{}
	}
	return Anchored(e, st, now).Next(now)
}
