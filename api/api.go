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
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The status view is status's: these are its names on the wire of GET
// /status, the same types, so the JSON is status's own.
type (
	// Status is what GET /status returns.
	Status = status.View
	// EntryStatus is one entry in Status.
	EntryStatus = status.Entry
	// Outcomes is what the workers reported about an entry's runs.
	Outcomes = status.Outcomes
	// RunOutcome is one run of an entry and what became of it.
	RunOutcome = status.RunOutcome
	// StatusQuery selects the entries GET /status shows.
	StatusQuery = status.Query
	// ShardStatus is one shard's leadership in a sharded cluster.
	ShardStatus = status.ShardStatus
)

// DefaultStatusLimit is the most entries GET /status shows unless asked.
const DefaultStatusLimit = status.DefaultLimit

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

// LiveBackend is a sharded replica's loops: the live fields of the
// entries of the shards it leads, which the other replicas' /status
// shows (status.LiveQuery).
type LiveBackend interface {
	Live(q status.LiveQuery) status.LiveAnswer
}

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
	// Live serves GET /status/live when set (a sharded replica).
	Live LiveBackend
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
		// On a sharded cluster the replica asks the other shards' leaders
		// for their entries' live fields as the caller.
		ctx, cancel := context.WithTimeout(auth.WithCredential(r.Context(), r), 5*time.Second)
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
	if c.Live != nil {
		// What another replica's /status asks of a shard's leader
		// (status.LiveQuery); a read like /status.
		mux.HandleFunc("GET /status/live", c.read(func(w http.ResponseWriter, r *http.Request) {
			q, err := status.ParseLiveQuery(r.URL.Query())
			if err != nil {
				writeError(w, http.StatusBadRequest, "", err.Error())
				return
			}
			writeJSON(w, http.StatusOK, c.Live.Live(q))
		}))
	}
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
