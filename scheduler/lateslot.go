package scheduler

import "time"

// late is the one rule for a late slot: a scheduled slot (not a manual
// fire, not a backfill) more than stepLateness past its due time at now.
// Such a slot goes through its entry's catch-up policy (catchUpPending,
// catchUpLate), and its message carries the entry's late_slot_expires
// (celery.Fire.Late), so that a worker's backlog does not run stale work.
func (p pendingFire) late(now time.Time) bool {
	return !p.manual && p.bf == nil && p.req == nil && now.Sub(p.due) > stepLateness
}
