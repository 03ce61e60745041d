package scheduler

import (
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
)

// catchupPlan is what a term does with one entry when it starts: the
// missed slots it publishes at once, the ones it drops (and why), and the
// slot it waits for next.
type catchupPlan struct {
	fire    []time.Time // oldest first
	dropped []drop
	next    time.Time // zero: the entry has no slot left (a past one-off)
}

// drop counts missed slots not fired for one reason.
type drop struct {
	reason string
	count  int64
}

// planCatchup applies e's catch-up policy to the slots of sched (e's
// schedule as the loop runs it: Anchored) owed since the state's
// CatchupFrom (or, for an entry never fired with start_at and catchup:
// all, since start_at) up to now, the instant the term was elected. It is
// pure: the loop applies the plan. A missed slot whose jittered due time
// is still ahead is not missed yet: it is the next slot.
func planCatchup(e *config.Entry, sched schedule.Schedule, st *store.EntryState, now time.Time) catchupPlan {
	var last time.Time
	if st != nil {
		last = st.CatchupFrom()
	}
	if last.IsZero() && !e.StartAt().IsZero() && e.Catchup == config.CatchupAll {
		last = e.StartAt().Add(-time.Nanosecond) // backfill from start_at, as asked
	}
	var p catchupPlan
	if last.IsZero() || !last.Before(now) {
		p.next = sched.Next(now)
		return p
	}
	windowStart := now.Add(-e.CatchupWindow)
	from := last
	if from.Before(windowStart) {
		if old := schedule.Missed(sched, last, windowStart, 0); old.Count > 0 {
			p.dropped = append(p.dropped, drop{ReasonWindow, old.Count})
		}
		from = windowStart
	}
	limit := 1
	if e.Catchup == config.CatchupAll {
		limit = int(e.MaxCatchup)
	}
	missed := schedule.Missed(sched, from, now, limit)
	slots := missed.Slots
	for len(slots) > 0 {
		s := slots[len(slots)-1]
		due := s.Add(jitter(e, s))
		if !due.After(now) {
			break
		}
		p.next = s
		slots = slots[:len(slots)-1]
		missed.Count--
	}
	if p.next.IsZero() {
		p.next = sched.Next(now)
	}
	if missed.Count <= 0 {
		return p
	}
	switch {
	case st != nil && st.Paused:
		p.dropped = append(p.dropped, drop{ReasonPaused, missed.Count})
	case e.Catchup == config.CatchupSkip:
		p.dropped = append(p.dropped, drop{ReasonSkip, missed.Count})
	case e.Catchup == config.CatchupOnce:
		if missed.Count > 1 {
			p.dropped = append(p.dropped, drop{ReasonOnce, missed.Count - 1})
		}
		p.fire = slots[len(slots)-1:]
	default:
		if n := missed.Count - int64(len(slots)); n > 0 {
			p.dropped = append(p.dropped, drop{ReasonMaxCatchup, n})
		}
		p.fire = slots
	}
	return p
}
