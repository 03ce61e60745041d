// Package api serves beatd's HTTP endpoints: health, readiness, metrics,
// status, and the authenticated admin actions.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Status is what GET /status returns.
type Status struct {
	ID           string        `json:"id"`
	Leader       bool          `json:"leader"`
	LeaderID     string        `json:"leader_id"`
	FencingToken int64         `json:"fencing_token"`
	Entries      []EntryStatus `json:"entries"`
	// EntriesTotal is how many entries match the query; Entries holds a
	// page of them, and Next, when set, is the ?after= of the next page.
	EntriesTotal int    `json:"entries_total"`
	Next         string `json:"next,omitempty"`
	// HistoryError says why recent runs are missing (the broker, which
	// keeps them, did not answer); empty when they are there.
	HistoryError string `json:"history_error,omitempty"`

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
}

// EntryStatus is one entry in Status.
type EntryStatus struct {
	Name     string `json:"name"`
	Source   string `json:"source,omitempty"`
	Task     string `json:"task"`
	Schedule string `json:"schedule"`
	Enabled  bool   `json:"enabled"`
	// Workflow names the tasks an entry with a chain or callbacks runs
	// ("a → b → c; link_error: d"); Templated says its values render
	// slot placeholders.
	Workflow      string       `json:"workflow,omitempty"`
	Templated     bool         `json:"templated,omitempty"`
	NextRunAt     *time.Time   `json:"next_run_at"`
	LastSlot      *time.Time   `json:"last_slot"`
	LastRunAt     *time.Time   `json:"last_run_at"`
	TotalRunCount int64        `json:"total_run_count"`
	Paused        bool         `json:"paused"`
	RecentRuns    []broker.Run `json:"recent_runs"`

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
	Outcome string    `json:"outcome"` // published, received, started, retried, succeeded, failed, revoked, expired, lost, skipped
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
}

// Backend is what the endpoints ask of the daemon.
type Backend interface {
	// Alive reports whether the process and its loop are running.
	Alive() error
	// Ready reports whether etcd and the broker are reachable (and, for
	// the leader, whether publishing works).
	Ready(ctx context.Context) error
	// Status is the cluster's state with a page of its entries.
	Status(ctx context.Context, q StatusQuery) (Status, error)
	// Request queues an admin action (trigger, pause or resume) and its
	// audit record; ErrUnknownEntry when the entry is not in the config.
	Request(ctx context.Context, a Action) (id string, err error)
}

// StatusQuery selects the entries GET /status shows: ?prefix= and
// ?after= (a page's Next), at most ?limit= (DefaultStatusLimit).
type StatusQuery struct {
	Prefix, After string
	Limit         int
}

// Default reports whether q is GET /status with no parameters (the one a
// replica keeps cached).
func (q StatusQuery) Default() bool {
	return q.Prefix == "" && q.After == "" && q.Limit == DefaultStatusLimit
}

// DefaultStatusLimit is the most entries GET /status shows unless asked:
// a million entries are never one response by default.
const DefaultStatusLimit = 1000

// Action is a change someone asked for: what, to which entry, who (the
// token's identity), through what (api, cli or console), and why.
type Action struct {
	Op    string
	Entry string
	// RespectOverlap (a trigger's ?respect_overlap=true) makes a trigger
	// obey the entry's overlap policy.
	RespectOverlap bool
	Note           string
	Who            auth.Identity
	Via            string
}

// Audit is the record it leaves.
func (a Action) Audit() *store.AuditRecord {
	return &store.AuditRecord{Actor: a.Who.Name, Role: a.Who.Role.String(), Via: a.Via, Action: a.Op, Entry: a.Entry, Note: a.Note}
}

// ErrUnknownEntry is returned by Backend.Request for an entry not in the
// config.
var ErrUnknownEntry = errors.New("api: unknown entry")

// Config configures the handler.
type Config struct {
	Backend  Backend
	Gatherer prometheus.Gatherer
	// Tokens says who a bearer token is and what it may do. Nil (or no
	// token configured) disables everything that needs a role; reads need
	// one only when Tokens.Guarded.
	Tokens *auth.Tokens
	// RequireNotes refuses a pause without a note.
	RequireNotes bool
	Logger       *slog.Logger
	// Entries serves /api/v1/entries when set.
	Entries EntriesBackend
	// Ops serves backfills and the audit trail when set.
	Ops OpsBackend
	// Now reads the clock (audit times); time.Now when nil.
	Now func() time.Time
	// ApplyLimit is the most entries one apply writes (etcd's
	// --max-txn-ops); MaxApplyEntries when 0.
	ApplyLimit int
}

// Handler returns the HTTP handler.
func Handler(c Config) http.Handler {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ApplyLimit <= 0 {
		c.ApplyLimit = MaxApplyEntries
	}
	mux := http.NewServeMux()
	registerProbes(mux, c)
	// /status is a read like the entries API: it carries pause reasons
	// (who paused, and their note), backfills, publish errors and the
	// workers' exception messages.
	mux.HandleFunc("GET /status", c.read(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		v := r.URL.Query()
		q := StatusQuery{Prefix: v.Get("prefix"), After: v.Get("after")}
		var err error
		if q.Limit, err = pageLimit(v, DefaultStatusLimit); err != nil {
			writeError(w, http.StatusBadRequest, "/limit", err.Error())
			return
		}
		st, err := c.Backend.Status(ctx, q)
		if err != nil {
			c.unavailable(w, err)
			return
		}
		writeJSON(w, http.StatusOK, st)
	}))
	admin := c.need(auth.RoleOperate, func(w http.ResponseWriter, r *http.Request, who auth.Identity) {
		op := r.PathValue("op")
		if op != "trigger" && op != "pause" && op != "resume" {
			http.NotFound(w, r)
			return
		}
		var body struct {
			Note string `json:"note"`
		}
		if !readOptional(w, r, &body) {
			return
		}
		name := r.PathValue("name")
		a := Action{Op: op, Entry: name, RespectOverlap: r.URL.Query().Get("respect_overlap") == "true",
			Note: noteOf(r, body.Note), Who: who, Via: via(r)}
		if op == "pause" && c.RequireNotes && strings.TrimSpace(a.Note) == "" {
			writeError(w, http.StatusUnprocessableEntity, "/note", "a pause needs a note saying why (this cluster runs with --require-notes)")
			return
		}
		id, err := c.Backend.Request(r.Context(), a)
		switch {
		case errors.Is(err, ErrUnknownEntry):
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no entry " + name})
		case err != nil:
			if _, fromEtcd := etcdRefusal(err); fromEtcd {
				c.unavailable(w, err)
				return
			}
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		default:
			c.Logger.Info("admin request", "op", op, "entry", name, "request", id, "actor", who.Name, "via", a.Via)
			writeJSON(w, http.StatusAccepted, map[string]string{"request": id, "op": op, "entry": name})
		}
	})
	mux.HandleFunc("POST /entries/{name}/{op}", admin)
	mux.HandleFunc("POST /api/v1/entries/{name}/{op}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("op") == "backfill" && c.Ops != nil {
			c.backfill(w, r)
			return
		}
		admin(w, r)
	})
	if c.Entries != nil {
		registerEntries(mux, c)
	}
	if c.Ops != nil {
		registerOps(mux, c)
	}
	registerPprof(mux, c)
	return mux
}

// ProbeHandler serves only /healthz, /readyz and /metrics: what probes
// and Prometheus need on a plain listener (--metrics-http), with no
// route that reads the schedule or changes it.
func ProbeHandler(c Config) http.Handler {
	mux := http.NewServeMux()
	registerProbes(mux, c)
	return mux
}

func registerProbes(mux *http.ServeMux, c Config) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := c.Backend.Alive(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := c.Backend.Ready(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.Gatherer, promhttp.HandlerOpts{}))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
