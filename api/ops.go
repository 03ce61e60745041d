package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
)

// OpsBackend serves backfills and the audit trail.
type OpsBackend interface {
	Auditor
	// Backfill checks spec for the entry and lists its slots; unless
	// spec.DryRun it also queues the job (and its audit record).
	Backfill(ctx context.Context, spec BackfillSpec, a Action) (BackfillAnswer, error)
	Backfills(ctx context.Context) ([]store.Backfill, error)
	// CancelBackfill queues the job's cancellation; ErrNoBackfill if
	// there is no such job, ErrBackfillFinished if it has ended.
	CancelBackfill(ctx context.Context, id string, a Action) error
}

// BackfillSpec is a backfill asked for.
type BackfillSpec struct {
	From         time.Time `json:"from"`
	To           time.Time `json:"to"`
	DryRun       bool      `json:"dry_run"`
	Rate         float64   `json:"rate"` // slots a second; 0: scheduler.DefaultBackfillRate
	IncludeFired bool      `json:"include_fired"`
	Note         string    `json:"note"`
}

// BackfillAnswer is the plan of a backfill, and the job queued for it
// (nil for a dry run).
type BackfillAnswer struct {
	Entry string                   `json:"entry"`
	Job   *store.Backfill          `json:"backfill,omitempty"`
	Slots []scheduler.BackfillSlot `json:"slots"`
	// Publish is how many slots it publishes; Fired how many it skips
	// (or, with include_fired, publishes again).
	Publish int `json:"publish"`
	Fired   int `json:"fired"`
}

// Errors of OpsBackend.
var (
	ErrNoBackfill       = errors.New("no such backfill")
	ErrBackfillFinished = errors.New("the backfill has ended")
)

// MaxAuditLimit is the most records one GET /api/v1/audit returns.
const MaxAuditLimit = 1000

func registerOps(mux *http.ServeMux, c Config) {
	b := c.Ops
	mux.HandleFunc("GET /api/v1/backfills", c.read(func(w http.ResponseWriter, r *http.Request) {
		jobs, err := b.Backfills(r.Context())
		if err != nil {
			c.unavailable(w, err)
			return
		}
		entry := r.URL.Query().Get("entry")
		out := jobs[:0]
		for _, j := range jobs {
			if entry == "" || j.Entry == entry {
				out = append(out, j)
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"backfills": out})
	}))
	mux.HandleFunc("GET /api/v1/backfills/{id}", c.read(func(w http.ResponseWriter, r *http.Request) {
		jobs, err := b.Backfills(r.Context())
		if err != nil {
			c.unavailable(w, err)
			return
		}
		for _, j := range jobs {
			if j.ID == r.PathValue("id") {
				writeJSON(w, http.StatusOK, j)
				return
			}
		}
		writeError(w, http.StatusNotFound, "", "no backfill "+r.PathValue("id"))
	}))
	mux.HandleFunc("DELETE /api/v1/backfills/{id}", c.need(auth.RoleOperate, func(w http.ResponseWriter, r *http.Request, who auth.Identity) {
		var body struct {
			Note string `json:"note"`
		}
		if !readOptional(w, r, &body) {
			return
		}
		id := r.PathValue("id")
		err := b.CancelBackfill(r.Context(), id, Action{Op: string(store.OpCancelBackfill), Note: noteOf(r, body.Note), Who: who, Via: via(r)})
		switch {
		case errors.Is(err, ErrNoBackfill):
			writeError(w, http.StatusNotFound, "", "no backfill "+id)
		case errors.Is(err, ErrBackfillFinished):
			writeError(w, http.StatusConflict, "", err.Error())
		case err != nil:
			c.unavailable(w, err)
		default:
			writeJSON(w, http.StatusAccepted, map[string]string{"backfill": id, "op": "cancel"})
		}
	}))
	mux.HandleFunc("GET /api/v1/audit", c.read(func(w http.ResponseWriter, r *http.Request) {
		limit := 100
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxAuditLimit {
				writeError(w, http.StatusBadRequest, "", fmt.Sprintf("limit must be 1 to %d", MaxAuditLimit))
				return
			}
			limit = n
		}
		recs, err := b.AuditLog(r.Context(), r.URL.Query().Get("entry"), limit)
		if err != nil {
			c.unavailable(w, err)
			return
		}
		if recs == nil {
			recs = []store.AuditRecord{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"records": recs})
	}))
}

// backfill is POST /api/v1/entries/{name}/backfill: a dry run lists the
// slots (read role is not enough: a plan is the start of a change, and
// it reads the run history); otherwise the job is queued.
func (c Config) backfill(w http.ResponseWriter, r *http.Request) {
	c.need(auth.RoleOperate, func(w http.ResponseWriter, r *http.Request, who auth.Identity) {
		var spec BackfillSpec
		if !readOptional(w, r, &spec) {
			return
		}
		switch {
		case spec.From.IsZero():
			writeError(w, http.StatusUnprocessableEntity, "/from", "from is required (RFC 3339)")
			return
		case spec.To.IsZero():
			writeError(w, http.StatusUnprocessableEntity, "/to", "to is required (RFC 3339)")
			return
		case spec.Rate < 0 || spec.Rate > scheduler.MaxBackfillRate:
			writeError(w, http.StatusUnprocessableEntity, "/rate", fmt.Sprintf("rate is slots a second, up to %g", scheduler.MaxBackfillRate))
			return
		}
		if spec.Rate == 0 {
			spec.Rate = scheduler.DefaultBackfillRate
		}
		name := r.PathValue("name")
		a := Action{Op: string(store.OpBackfill), Entry: name, Note: noteOf(r, spec.Note), Who: who, Via: via(r)}
		ans, err := c.Ops.Backfill(r.Context(), spec, a)
		var re *scheduler.RangeError
		switch {
		case errors.Is(err, ErrUnknownEntry):
			writeError(w, http.StatusNotFound, "", "no entry "+name)
		case errors.As(err, &re):
			ptr := ""
			if re.Field != "" {
				ptr = "/" + re.Field
			}
			writeError(w, http.StatusUnprocessableEntity, ptr, re.Msg)
		case errors.Is(err, store.ErrBackfillBusy):
			writeError(w, http.StatusConflict, "", err.Error())
		case err != nil:
			c.unavailable(w, err)
		case spec.DryRun:
			writeJSON(w, http.StatusOK, ans)
		default:
			c.Logger.Info("backfill queued", "entry", name, "backfill", ans.Job.ID, "slots", ans.Publish, "actor", who.Name)
			writeJSON(w, http.StatusAccepted, ans)
		}
	})(w, r)
}
