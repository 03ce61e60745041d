package status

import (
	"time"

	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
)

// View is the cluster's status with a page of its entries: what GET
// /status returns (as api.Status).
type View struct {
	ID           string  `json:"id"`
	Leader       bool    `json:"leader"`
	LeaderID     string  `json:"leader_id"`
	FencingToken int64   `json:"fencing_token"`
	Entries      []Entry `json:"entries"`
	// EntriesTotal is how many entries match the query; Entries holds a
	// page of them, and Next, when set, is the ?after= of the next page.
	EntriesTotal int    `json:"entries_total"`
	Next         string `json:"next,omitempty"`
	// HistoryError says why recent runs are missing (the broker, which
	// keeps them, did not answer); empty when they are there.
	HistoryError string `json:"history_error,omitempty"`

	// Shards is who leads each shard of a sharded cluster (--shards > 1),
	// whose LeaderID and FencingToken are then empty: each shard has a
	// leader and a token of its own.
	Shards []ShardStatus `json:"shards,omitempty"`

	// LeaderLeaseSeconds is what is left of the leader key's lease, in
	// etcd's whole seconds; LeaderUnresponsive says the leader has not
	// renewed it on time (it is dying or gone; the key expires soon).
	LeaderLeaseSeconds int64 `json:"leader_lease_seconds,omitempty"`
	LeaderUnresponsive bool  `json:"leader_unresponsive,omitempty"`

	// Stale marks an answer from what the replica last knew, because etcd
	// did not answer in time; StaleSeconds is that knowledge's age and
	// Error why it is stale.
	Stale        bool    `json:"stale,omitempty"`
	StaleSeconds float64 `json:"stale_seconds,omitempty"`
	Error        string  `json:"error,omitempty"`
	// Sources is each entry source's health; Conflicts the names claimed
	// by more than one source.
	Sources   []sources.Health   `json:"sources,omitempty"`
	Conflicts []sources.Conflict `json:"conflicts,omitempty"`
	// OutcomeWarning says, when no task event or result has reached this
	// replica for --outcome-silence, that run outcomes are unknown and
	// what to change; empty while reports come.
	OutcomeWarning string `json:"outcome_warning,omitempty"`
	// ClockOffsetSeconds is this replica's wall clock minus etcd's
	// (positive: ahead), within ClockOffsetUncertaintySeconds; a leader
	// fires by its own clock. ClockWarning says when it is past
	// --clock-offset-warn, or why it is unknown.
	ClockOffsetSeconds            *float64 `json:"clock_offset_seconds,omitempty"`
	ClockOffsetUncertaintySeconds float64  `json:"clock_offset_uncertainty_seconds,omitempty"`
	ClockWarning                  string   `json:"clock_warning,omitempty"`
	// Backfills are the backfills not yet finished, with their progress.
	Backfills []store.Backfill `json:"backfills,omitempty"`
	// Parked is set on a replica started with --park: it runs its
	// embedded etcd member and nothing of the schedule (no election, no
	// registration, no publish), so the cluster can be resized while the
	// members keep etcd's quorum.
	Parked *Parked `json:"parked,omitempty"`
}

// Parked is a parked replica's status: since when, and the cluster's
// shard count and resize as etcd holds them now.
type Parked struct {
	Since time.Time `json:"since"`
	// Why says what a parked replica is, for a reader of /status.
	Why string `json:"why"`
	// ShardCount is the cluster's recorded count (1 when none is).
	ShardCount int `json:"shard_count"`
	// Resize is a resize in progress or unfinished, as `beatd shards
	// show` prints it ("" when none).
	Resize string `json:"resize,omitempty"`
}

// ShardStatus is one shard's leadership: the replica that leads it (empty
// while none does) and its term's fencing token.
type ShardStatus struct {
	Shard        int    `json:"shard"`
	LeaderID     string `json:"leader_id"`
	FencingToken int64  `json:"fencing_token"`
	// Leader says the replica that answered leads this shard now (its
	// term's token is FencingToken).
	Leader bool `json:"leader,omitempty"`
	// LiveError says why the live fields of this shard's entries
	// (last_result, last_error, last_published_at, health, the leader's
	// next_run_at) are missing from this answer: the shard has no
	// leader, or its leader did not answer in time, or no longer holds
	// that term. Empty when they are there (or the entries have none).
	LiveError string `json:"live_error,omitempty"`
}

// Entry is one entry's status (as api.EntryStatus). Build fills it; a
// field added here is in /status's JSON at once, and the CLI (printEntry)
// and the console (its templates embed Entry) show it once they name it.
type Entry struct {
	Name     string `json:"name"`
	Source   string `json:"source,omitempty"`
	Task     string `json:"task"`
	Schedule string `json:"schedule"`
	Enabled  bool   `json:"enabled"`
	// Workflow names the tasks an entry with a chain or callbacks runs
	// ("a → b → c; link_error: d"); Templated says its values render
	// slot placeholders.
	Workflow      string        `json:"workflow,omitempty"`
	Templated     bool          `json:"templated,omitempty"`
	NextRunAt     *time.Time    `json:"next_run_at"`
	LastSlot      *time.Time    `json:"last_slot"`
	LastRunAt     *time.Time    `json:"last_run_at"`
	TotalRunCount int64         `json:"total_run_count"`
	Paused        bool          `json:"paused"`
	RecentRuns    []outcome.Run `json:"recent_runs"`

	// The last publish, as the leader that published it remembers it:
	// its result (ok, duplicate, error...) and error, and when an entry
	// was last published.
	LastResult      string     `json:"last_result,omitempty"`
	LastError       string     `json:"last_error,omitempty"`
	LastErrorAt     *time.Time `json:"last_error_at,omitempty"`
	LastPublishedAt *time.Time `json:"last_published_at,omitempty"`

	Outcomes
	Overlap string `json:"overlap,omitempty"`
	// Finished: it reached its end_at or made its max_runs, and will not
	// fire again (which is not an error). RemainingRuns is what is left
	// of its max_runs.
	Finished      bool `json:"finished,omitempty"`
	RemainingRuns *int `json:"remaining_runs,omitempty"`
	// Health is "behind" while the entry's slots come due faster than the
	// leader publishes them, "runaway" once the leader stopped it because
	// its schedule went wrong; empty while it keeps its schedule.
	Health       string `json:"health,omitempty"`
	HealthReason string `json:"health_reason,omitempty"`

	// What the renderers show that the wire leaves out, so /status's JSON
	// stays as it was: the schedule in words, and the newest fire.
	ScheduleWords string `json:"-"`
	LastFire      Fire   `json:"-"`
}

// Fire is an entry's newest fire as the console shows it: when, and its
// result in words (ResultWords).
type Fire struct {
	At     time.Time
	Result string
}

// Outcomes is what the workers reported about an entry's runs, kept with
// its state: the last runs and what each reached, the last success and
// failure on a worker, the failures in a row, and why
// pause_after_failures paused the entry. Running says the newest run has
// not finished.
type Outcomes struct {
	Runs                []RunOutcome `json:"runs,omitempty"`
	Running             bool         `json:"running,omitempty"`
	LastSuccessAt       *time.Time   `json:"last_success_at,omitempty"`
	LastFailureAt       *time.Time   `json:"last_failure_at,omitempty"`
	ConsecutiveFailures int          `json:"consecutive_failures,omitempty"`
	PauseReason         string       `json:"pause_reason,omitempty"`
}

// RunOutcome is one run of an entry and what became of it on the workers.
type RunOutcome struct {
	Slot    time.Time `json:"slot"`
	TaskID  string    `json:"task_id"`
	Manual  bool      `json:"manual,omitempty"`
	Outcome string    `json:"outcome"` // an outcome.Kind's word: published, received, started, retried, succeeded, failed, revoked, expired, lost, skipped, unreported
	// PublishedAt is when it was published, or for a skipped slot, when
	// it was skipped.
	PublishedAt    time.Time  `json:"published_at"`
	StartedAt      *time.Time `json:"started_at,omitempty"`
	UpdatedAt      *time.Time `json:"updated_at,omitempty"` // the newest report's time
	RuntimeSeconds float64    `json:"runtime_seconds,omitempty"`
	Worker         string     `json:"worker,omitempty"`
	Exception      string     `json:"exception,omitempty"`
	Message        string     `json:"exception_message,omitempty"`
	// SkippedSlots is, for a skipped record, how many slots in a row it
	// stands for; Slot is the newest of them.
	SkippedSlots int `json:"skipped_slots,omitempty"`
	// Step is, for a run of an entry with a chain that has not succeeded,
	// the step it is at, or failed, was revoked, expired or was lost at:
	// "step 2/3 etl.transform" (the entry's task is step 1). Outcome is
	// the whole chain's: succeeded only once the last step succeeded.
	Step string `json:"step,omitempty"`
}

// Query selects the entries a view shows: ?prefix= and ?after= (a page's
// Next), at most ?limit= (DefaultLimit).
type Query struct {
	Prefix, After string
	Limit         int
}

// Default reports whether q is GET /status with no parameters (the one a
// replica keeps cached).
func (q Query) Default() bool {
	return q.Prefix == "" && q.After == "" && q.Limit == DefaultLimit
}

// DefaultLimit is the most entries a view shows unless asked: a million
// entries are never one response by default.
const DefaultLimit = 1000
