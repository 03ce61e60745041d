package scheduler

import (
	"container/heap"
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

// applyPlan queues a catch-up plan's fires and counts what it dropped.
func (l *loop) applyPlan(e *entry, plan catchupPlan) {
	m := l.s.cfg.Metrics
	for _, d := range plan.dropped {
		m.Missed.WithLabelValues(e.Name, d.reason).Add(float64(d.count))
	}
	for _, s := range plan.fire {
		l.queue(pendingFire{e: e, slot: s, due: s})
	}
}

// stepLateness is how late a slot may be found and still fire as a
// regular slot. Later than that, the wall clock stepped forward (NTP, a VM
// resumed) or the loop stalled, and the slots since go through the
// entry's catch-up policy, as after a failover: catchup: once fires the
// latest, skip none, all each within the window.
const stepLateness = 30 * time.Second

// catchUpPending applies each entry's catch-up policy to its pending
// scheduled slots over stepLateness late, which a publish that kept
// failing left there: the one rule for a late slot, wherever it waited.
// catchup: all keeps them (within catchup_window), once the latest, skip
// none. Manual fires and backfills are kept as they are.
func (l *loop) catchUpPending(now time.Time) {
	late := func(p pendingFire) bool { return p.late(now) }
	var latest map[*entry]time.Time
	for _, p := range l.pending {
		if late(p) && p.e.Catchup == config.CatchupOnce {
			if latest == nil {
				latest = map[*entry]time.Time{}
			}
			if p.slot.After(latest[p.e]) {
				latest[p.e] = p.slot
			}
		}
	}
	m := l.s.cfg.Metrics
	kept := l.pending[:0]
	for _, p := range l.pending {
		reason := ""
		if late(p) {
			switch p.e.Catchup {
			case config.CatchupSkip:
				reason = ReasonSkip
			case config.CatchupOnce:
				if !p.slot.Equal(latest[p.e]) {
					reason = ReasonOnce
				}
			default:
				if p.due.Before(now.Add(-p.e.CatchupWindow)) {
					reason = ReasonWindow
				}
			}
		}
		if reason == "" {
			kept = append(kept, p)
			continue
		}
		m.Missed.WithLabelValues(p.e.Name, reason).Inc()
	}
	clear(l.pending[len(kept):])
	l.pending = kept
}

// catchUpLate applies e's catch-up policy to it's slot and every slot
// after it up to now, and moves it to the next slot. It returns how many
// slots it queued.
func (l *loop) catchUpLate(it *item, now time.Time) int {
	e := it.e
	prev := store.EntryState{LastSlot: it.slot.Add(-time.Nanosecond)}
	if st := l.books.states[e.Name]; st != nil {
		prev.Paused = st.Paused
	}
	plan := planCatchup(e.Entry, e.sched, &prev, now)
	if why := plan.insane(e.Entry, now); why != "" {
		l.stopRunaway(e, why, now)
		return 0
	}
	l.applyPlan(e, plan)
	m := l.s.cfg.Metrics
	if plan.next.IsZero() {
		heap.Remove(&l.heap, it.index)
		e.it = nil
		m.scheduled(e.Name, time.Time{})
		return len(plan.fire)
	}
	it.set(plan.next)
	m.scheduled(e.Name, it.dueTime())
	heap.Fix(&l.heap, it.index)
	return len(plan.fire)
}
