package scheduler

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/beatd/beatd/store"
)

// requestsChanged applies the admin requests after their watch said they
// changed (ok false: the watch closed).
func (l *loop) requestsChanged(ctx context.Context, ok bool) (done bool, err error) {
	s := l.s
	if !ok {
		l.requests = nil
		if ctx.Err() == nil {
			return true, fmt.Errorf("%w: request watch closed", ErrTermEnded)
		}
		return false, nil
	}
	reqs, _, err := s.cfg.Store.PendingRequests(ctx)
	if err != nil {
		s.cfg.Metrics.EtcdErrors.Inc()
		s.log.Warn("list admin requests", "err", err)
		return false, nil
	}
	l.handleRequests(ctx, reqs)
	return false, nil
}

// applyReload swaps in the latest config without firing spuriously.
func (l *loop) applyReload(now time.Time) {
	set, names, full := l.s.takeDelta()
	if set == l.set {
		return
	}
	if !full {
		l.applyDelta(set, names, now)
		return
	}
	old := l.set
	l.set = set
	defer l.s.applied.Store(set)
	l.heap = l.heap[:0]
	j := 0 // both sets are in name order: walk them together
	for _, e := range set.list {
		for j < len(old.list) && old.list[j].Name < e.Name {
			old.list[j].it = nil
			j++
		}
		var prev *entry
		if j < len(old.list) && old.list[j].Name == e.Name {
			prev = old.list[j]
			j++
		}
		if prev != nil && prev.it != nil && prev.Fingerprint == e.Fingerprint {
			// The same entry, on the grid startEntry anchored.
			it := prev.it
			e.sched, prev.it = prev.sched, nil
			it.e, e.it = e, it
			l.heap = append(l.heap, it)
			continue
		}
		if prev != nil {
			prev.it = nil
		}
		e.it = nil
		l.startEntry(e, l.books.states[e.Name], now, false)
	}
	for ; j < len(old.list); j++ {
		old.list[j].it = nil
	}
	for i, it := range l.heap {
		it.index = i
	}
	heap.Init(&l.heap)
	// Removed entries keep their state (and broker keys) for
	// RemovedGrace, in case they come back; the sweep drops them after.
	var marked []store.EntryState
	configured := set.names()
	for name, st := range l.books.states {
		_, has := configured[name]
		if changed, _ := st.Reconcile(has, now, l.s.cfg.RemovedGrace); changed {
			marked = append(marked, *st)
		}
	}
	if len(marked) > 0 {
		l.persist.save(marked...)
	}
	l.repointPending(set, func(string) bool { return true })
	l.purgeFlags()
	l.flushBaseline()
	l.s.log.Info("config applied", "entries", len(set.list))
}

// applyDelta is applyReload for a set that differs from the loop's in
// the entries named only: those are rescheduled (or dropped), the rest of
// the heap is left as it is.
func (l *loop) applyDelta(set *entrySet, names map[string]struct{}, now time.Time) {
	old := l.set
	l.set = set
	defer l.s.applied.Store(set)
	var marked []store.EntryState
	for name := range names {
		prev, e := old.get(name), set.get(name)
		had, has := prev != nil, e != nil
		if had && has && prev == e {
			continue // named by an earlier change the loop already has
		}
		var it *item
		if had {
			it, prev.it = prev.it, nil
		}
		if had && has && it != nil && prev.Fingerprint == e.Fingerprint {
			e.sched, e.task, e.fires, e.runs = prev.sched, prev.task, prev.fires, prev.runs
			it.e, e.it = e, it
			continue
		}
		if it != nil {
			heap.Remove(&l.heap, it.index)
			l.s.cfg.Metrics.scheduled(name, time.Time{})
		}
		if has {
			e.it = nil
			l.startEntry(e, l.books.states[name], now, false)
			if e.it != nil {
				heap.Fix(&l.heap, e.it.index)
			}
		}
		if st := l.books.states[name]; st != nil {
			if changed, _ := st.Reconcile(has, now, l.s.cfg.RemovedGrace); changed {
				marked = append(marked, *st)
			}
		}
	}
	if len(marked) > 0 {
		l.persist.save(marked...)
	}
	l.repointPending(set, func(name string) bool { _, ok := names[name]; return ok })
	l.purgeFlags()
	l.flushBaseline()
	l.s.log.Info("config applied", "entries", len(set.list), "changed", len(names))
}

// repointPending points the pending fires of the entries changed says
// changed at set's definitions. Those of entries no longer in set are
// dropped, and counted.
func (l *loop) repointPending(set *entrySet, changed func(name string) bool) {
	kept := l.pending[:0]
	for _, p := range l.pending {
		if !changed(p.e.Name) {
			kept = append(kept, p)
		} else if e := set.get(p.e.Name); e != nil {
			p.e = e
			kept = append(kept, p)
		} else {
			l.s.cfg.Metrics.Missed.WithLabelValues(p.e.Name, ReasonRemoved).Inc()
		}
	}
	l.pending = kept
}

// handleRequests applies admin requests. A trigger becomes a pending manual
// fire, completed once published; pause and resume complete at once, in
// order with state writes.
func (l *loop) handleRequests(ctx context.Context, reqs []store.Request) {
	now := l.s.cfg.Clock.Now()
	for _, r := range reqs {
		if l.persist.seen(r.ID) {
			continue
		}
		switch r.Op {
		case store.OpBackfill:
			l.persist.markSeen(r.ID)
			if !l.startBackfill(ctx, r, now) {
				l.bf.retry = append(l.bf.retry, r)
			}
			continue
		case store.OpCancelBackfill:
			l.persist.markSeen(r.ID)
			l.cancelBackfill(ctx, r, reqs, now)
			continue
		}
		e := l.set.get(r.Entry)
		if e == nil {
			l.s.log.Warn("admin request for an unknown entry", "op", r.Op, "entry", r.Entry)
			l.persist.complete(r, nil)
			continue
		}
		b := l.book(e)
		switch r.Op {
		case store.OpTrigger:
			b.state() // a trigger makes the entry's state, as any fire
			req := r
			now := l.s.cfg.Clock.Now()
			// Its slot is when it was asked for, so whichever leader
			// publishes it renders the same message ({{ slot }}); a
			// request from before RequestedAt was kept has none.
			slot := r.RequestedAt
			if slot.IsZero() {
				slot = now
			}
			l.pending = append(l.pending, pendingFire{e: e, slot: slot, due: now, manual: true, req: &req})
			l.persist.markSeen(r.ID)
		case store.OpPause:
			b.Paused(r)
		case store.OpResume:
			b.Resumed(r, l.s.cfg.Clock.Now())
		default:
			l.persist.complete(r, nil)
		}
	}
}

// manualPauseReason is what status says of a manual pause: who, when, why.
func manualPauseReason(r store.Request) string {
	why := "paused"
	if r.Actor != "" {
		why += " by " + r.Actor
	}
	why += " at " + r.RequestedAt.UTC().Format(time.RFC3339)
	if r.Note != "" {
		why += ": " + r.Note
	}
	return why
}
