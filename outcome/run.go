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
