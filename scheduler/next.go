package scheduler

import (
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/upcoming"
)

// When an entry fires is upcoming's to say, so the loop and every view
// of it agree; these name its answers for the loop and its tests.

// Anchored is e's schedule as the leader runs it (upcoming.Anchored).
func Anchored(e *config.Entry, st *store.EntryState, now time.Time) schedule.Schedule {
	return upcoming.Anchored(e, st, now)
}

// bounded wraps s in e's exclusions and end_at (upcoming.Bounded).
func bounded(e *config.Entry, s schedule.Schedule) schedule.Schedule { return upcoming.Bounded(e, s) }

// Finished says e will not fire again (upcoming.Finished).
func Finished(e *config.Entry, st *store.EntryState, now time.Time) (finished bool, remaining int) {
	return upcoming.Finished(e, st, now)
}

// NextFire is when e fires next after now (upcoming.Next).
func NextFire(e *config.Entry, st *store.EntryState, now time.Time) time.Time {
	return upcoming.Next(e, st, now)
}
