package outcome

import (
	"context"
	"time"
)

// Run is one fire of an entry and what became of it: the one model of a
// run, whoever keeps it. The broker's run history (broker/redis) records
// the publish (slot, time, token, task id); an entry's state in etcd
// (store) keeps its newest few runs with what the workers reported, and
// slots skipped for overlap. The reported fields are not in the JSON of
// the API's recent runs, which come from the broker's history alone.
type Run struct {
	Slot time.Time `json:"slot"`
	// PublishedAt is when the fire was published or, for a skipped slot,
	// when it was skipped.
	PublishedAt time.Time `json:"published_at"`
	Token       int64     `json:"token"` // the publishing leader's fencing token (the broker's history only)
	// TaskID is the task's id. The state keeps only a manual run's: a
	// scheduled run's is derived from its slot (celery.SlotIDOf).
	TaskID   string `json:"task_id"`
	Manual   bool   `json:"manual,omitempty"`
	Backfill bool   `json:"backfill,omitempty"` // a past slot published by a backfill

	Kind    Kind          `json:"-"`
	Updated time.Time     `json:"-"` // when the newest report about it was made
	Started time.Time     `json:"-"`
	Runtime time.Duration `json:"-"`
	Worker  string        `json:"-"`
	ExcType string        `json:"-"`
	ExcMsg  string        `json:"-"`
	// Skips is, for a skipped record, how many slots in a row it stands
	// for (Slot is the newest): a long run skipping every second keeps
	// the runs before it in sight.
	Skips int `json:"-"`
	// Chain is how many chained steps follow the task in the run's
	// message (at most celery.MaxChainSteps), as published: the entry's
	// definition may change while the run is out. Step is the one the
	// run is at: 0 its task, n the chain's step n.
	Chain, Step uint8 `json:"-"`
}

// Apply moves r by ev, a report about its step n (0: its own task, n > 0:
// the chain's step n), made at at. moved says r changed; ended that the
// report finished it.
//
// A run with a chain is the whole chain, as Celery runs it: it is at the
// step its newest report is about, and a report about a later step
// supersedes any about an earlier one (the two sources, and events from
// different workers, race). A step that succeeds moves the run to the
// next step, published: the worker sends the next step before it reports
// the success. Only the last step's success ends the run succeeded. A
// step that fails, is revoked or expires ends it there with that step's
// outcome and exception: Celery then sends no later step (it runs the
// link_error callbacks instead). Callbacks are not followed: the worker
// draws their task ids.
//
// A chained run's Started is its task's start and its Runtime the span
// from there to the last step's end, as the workers' clocks tell it
// (queueing between steps included); a plain run's Runtime is its task's.
func (r *Run) Apply(n int, ev Event, at time.Time) (moved, ended bool) {
	if r.Kind.Finished() || n < 0 || n > int(r.Chain) {
		return false, false
	}
	step, kind := n, ev.Kind
	if kind == Succeeded && n < int(r.Chain) {
		step, kind = n+1, Published
	}
	if step < int(r.Step) || step == int(r.Step) && !kind.Supersedes(r.Kind) {
		return false, false
	}
	r.Kind, r.Step, r.Updated = kind, uint8(step), at
	if ev.Worker != "" {
		r.Worker = ev.Worker
	}
	if ev.Kind == Started && (n == 0 || r.Started.IsZero()) {
		r.Started = at
	}
	switch {
	case r.Chain == 0:
		if ev.Runtime > 0 {
			r.Runtime = ev.Runtime
		}
	case kind == Succeeded && !r.Started.IsZero() && at.After(r.Started):
		r.Runtime = at.Sub(r.Started)
	}
	if ev.ExcType != "" || ev.ExcMessage != "" {
		r.ExcType, r.ExcMsg = ev.ExcType, ev.ExcMessage
	}
	return true, kind.Finished()
}

// EntryRuns is what the broker's run history remembers of one entry.
type EntryRuns struct {
	Runs  []Run // newest first
	Count int64 // runs published since the history began
}

// LastRunAt is when the newest run was published, or zero.
func (h EntryRuns) LastRunAt() time.Time {
	if len(h.Runs) == 0 {
		return time.Time{}
	}
	return h.Runs[0].PublishedAt
}

// History reads entries' last runs from the broker's run history (the
// Redis publisher keeps one; RabbitMQ keeps none, so callers take a nil
// History). Status, the entries API, the console, django-celery-beat's
// write-back and backfills read through it.
type History interface {
	// Histories reads the named entries' runs in one round trip; entries
	// without runs are absent from the result.
	Histories(ctx context.Context, names []string) (map[string]EntryRuns, error)
}
