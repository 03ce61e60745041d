package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
)

// Body size limits of the entries API: one entry, and a set applied at
// once.
const (
	MaxEntryBody = 64 << 10
	// MaxApplyBody is the largest POST /api/v1/entries: an apply is one
	// etcd transaction (all or none), which etcd takes up to its
	// --max-request-bytes (EtcdMaxRequestBytes, 1.5 MiB by default) with
	// every key and value. The compacted entries are no larger than the
	// body, and the other half MiB is room for the keys (prefix and name)
	// of MaxApplyEntries entries.
	MaxApplyBody = 1 << 20
	// MaxApplyEntries is the most entries one apply writes: etcd refuses a
	// transaction of more operations than its --max-txn-ops (128 unless
	// raised).
	MaxApplyEntries = 128
)

// Entry is one entry as the entries API shows it, from any source.
type Entry struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	// Active is false for a runtime entry that is not running: another
	// source owns the name (see Problem) or it no longer validates.
	Active   bool   `json:"active"`
	Problem  string `json:"problem,omitempty"`
	Task     string `json:"task,omitempty"`
	Schedule string `json:"schedule,omitempty"`
	// Workflow names the tasks of an entry with a chain or callbacks,
	// as status says it (status.Entry.Workflow).
	Workflow string        `json:"workflow,omitempty"`
	Enabled  bool          `json:"enabled"`
	Paused   bool          `json:"paused"`
	NextRuns []time.Time   `json:"next_runs"`
	LastRuns []outcome.Run `json:"last_runs"`
	// Outcomes are what the workers reported about its runs.
	Outcomes
	// Spec is the stored document of a runtime entry (source api), and
	// ModRevision its etcd mod revision, for If-Match.
	Spec        json.RawMessage `json:"spec,omitempty"`
	ModRevision int64           `json:"mod_revision,omitempty"`
}

// EntryDoc is a runtime entry to write.
type EntryDoc struct {
	Name string
	Spec json.RawMessage
}

// EntriesBackend is what the entries API asks of the daemon. Errors:
// sources.ErrNotFound (404), sources.ErrPrecondition and ErrFileOwned
// (409), config.FieldErrors or *DocErrors (422).
type EntriesBackend interface {
	// ListEntries returns a page of entries in name order.
	ListEntries(ctx context.Context, q ListQuery) (Page, error)
	GetEntry(ctx context.Context, name string) (Entry, error)
	// PutEntries validates and writes docs in one etcd transaction;
	// ifMatch gives, per name, the mod revision required (0: must not
	// exist). It returns the revision written.
	PutEntries(ctx context.Context, docs []EntryDoc, ifMatch map[string]int64) (int64, error)
	DeleteEntry(ctx context.Context, name string, ifMatch int64) error
}

// ListQuery selects a page of entries: those whose names follow After
// and start with Prefix, of Task and Queue when set, at most Limit.
type ListQuery struct {
	After, Prefix, Task, Queue string
	Limit                      int
}

// Page is a page of entries; Next, when set, is the After of the next.
type Page struct {
	Entries []Entry `json:"entries"`
	Next    string  `json:"next,omitempty"`
}

// Page sizes of GET /api/v1/entries: a million entries are never one
// response (188 MB at 300k before pages).
const (
	DefaultPageLimit = 500
	MaxPageLimit     = 5000
)

// listQuery reads ?after=&prefix=&task=&queue=&limit= .
func listQuery(r *http.Request) (ListQuery, string, error) {
	v := r.URL.Query()
	q := ListQuery{After: v.Get("after"), Prefix: v.Get("prefix"), Task: v.Get("task"), Queue: v.Get("queue")}
	var err error
	if q.Limit, err = pageLimit(v, DefaultPageLimit); err != nil {
		return q, "/limit", err
	}
	return q, "", nil
}

// pageLimit reads ?limit= of a paged answer: 1 to MaxPageLimit, def when
// absent.
func pageLimit(v url.Values, def int) (int, error) {
	l := v.Get("limit")
	if l == "" {
		return def, nil
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > MaxPageLimit {
		return 0, fmt.Errorf("limit must be a number from 1 to %d, got %q", MaxPageLimit, l)
	}
	return n, nil
}

// ErrFileOwned: the name is an entry of schedules.yaml, which owns it.
var ErrFileOwned = errors.New("the entry is defined in schedules.yaml, which owns its names; change it there")

// DocErrors are validation errors of several documents, keyed by entry.
type DocErrors map[string]config.FieldErrors

func (e DocErrors) Error() string {
	var parts []string
	for name, fe := range e {
		parts = append(parts, name+": "+fe.Error())
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// apiError is the body of every error of the entries API.
type apiError struct {
	Errors []config.FieldError `json:"errors"`
}

func writeError(w http.ResponseWriter, code int, pointer, msg string) {
	writeJSON(w, code, apiError{Errors: []config.FieldError{{Pointer: pointer, Message: msg}}})
}

// registerEntries adds /api/v1/entries to mux.
func registerEntries(mux *http.ServeMux, c Config) {
	b := c.Entries
	mux.HandleFunc("GET /api/v1/entries", c.read(func(w http.ResponseWriter, r *http.Request) {
		q, ptr, err := listQuery(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, ptr, err.Error())
			return
		}
		page, err := b.ListEntries(r.Context(), q)
		if err != nil {
			c.backendError(w, err, "")
			return
		}
		if page.Entries == nil {
			page.Entries = []Entry{}
		}
		writeJSON(w, http.StatusOK, page)
	}))
	mux.HandleFunc("GET /api/v1/entries/{name}", c.read(func(w http.ResponseWriter, r *http.Request) {
		e, err := b.GetEntry(r.Context(), r.PathValue("name"))
		if err != nil {
			c.backendError(w, err, "")
			return
		}
		if e.ModRevision > 0 {
			w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(e.ModRevision, 10)))
		}
		writeJSON(w, http.StatusOK, e)
	}))
	mux.HandleFunc("PUT /api/v1/entries/{name}", c.write(func(w http.ResponseWriter, r *http.Request, who auth.Identity) {
		name := r.PathValue("name")
		spec, ok := readDoc(w, r, MaxEntryBody)
		if !ok {
			return
		}
		ifMatch := map[string]int64{}
		if rev, set, err := preconditions(r); err != nil {
			writeError(w, http.StatusBadRequest, "", err.Error())
			return
		} else if set {
			ifMatch[name] = rev
		}
		rev, err := b.PutEntries(r.Context(), []EntryDoc{{Name: name, Spec: spec}}, ifMatch)
		var de DocErrors
		if errors.As(err, &de) && len(de[name]) > 0 {
			err = de[name] // pointers into the body, which is the one entry
		}
		if err != nil {
			c.backendError(w, err, "")
			return
		}
		c.Logger.Info("entry written", "entry", name, "source", sources.API, "revision", rev, "actor", who.Name)
		c.record(r, who, &store.AuditRecord{Action: "put", Entry: name, Detail: "mod_revision " + strconv.FormatInt(rev, 10)})
		w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(rev, 10)))
		writeJSON(w, http.StatusOK, map[string]any{"name": name, "source": sources.API, "mod_revision": rev})
	}))
	// POST /api/v1/entries applies a set of entries in one transaction:
	// {"entries": {"NAME": {...}, ...}}.
	mux.HandleFunc("POST /api/v1/entries", c.write(func(w http.ResponseWriter, r *http.Request, who auth.Identity) {
		body, ok := readDoc(w, r, MaxApplyBody)
		if !ok {
			return
		}
		var set struct {
			Entries map[string]json.RawMessage `json:"entries"`
		}
		if err := json.Unmarshal(body, &set); err != nil {
			writeError(w, http.StatusBadRequest, "", "want {\"entries\": {NAME: ENTRY, ...}}: "+err.Error())
			return
		}
		if len(set.Entries) == 0 {
			writeError(w, http.StatusUnprocessableEntity, "/entries", "no entries to apply")
			return
		}
		if len(set.Entries) > c.ApplyLimit {
			// max_entries lets a client split and retry (the CLI does).
			writeJSON(w, http.StatusUnprocessableEntity, struct {
				apiError
				MaxEntries int `json:"max_entries"`
			}{apiError{[]config.FieldError{{Pointer: "/entries", Message: fmt.Sprintf(
				"%d entries: one transaction takes at most %d (etcd's --max-txn-ops); split the file", len(set.Entries), c.ApplyLimit)}}}, c.ApplyLimit})
			return
		}
		docs := make([]EntryDoc, 0, len(set.Entries))
		for name, spec := range set.Entries {
			var buf bytes.Buffer
			if err := json.Compact(&buf, spec); err != nil {
				writeError(w, http.StatusBadRequest, "/entries/"+pointerToken(name), err.Error())
				return
			}
			docs = append(docs, EntryDoc{Name: name, Spec: buf.Bytes()})
		}
		sort.Slice(docs, func(i, j int) bool { return docs[i].Name < docs[j].Name })
		rev, err := b.PutEntries(r.Context(), docs, nil)
		if err != nil {
			c.backendError(w, err, "/entries")
			return
		}
		names := make([]string, len(docs))
		for i, d := range docs {
			names[i] = d.Name
		}
		c.Logger.Info("entries applied", "entries", len(names), "source", sources.API, "revision", rev, "actor", who.Name)
		c.record(r, who, &store.AuditRecord{Action: "put", Entries: names, Detail: "mod_revision " + strconv.FormatInt(rev, 10)})
		writeJSON(w, http.StatusOK, map[string]any{"applied": names, "mod_revision": rev})
	}))
	mux.HandleFunc("DELETE /api/v1/entries/{name}", c.write(func(w http.ResponseWriter, r *http.Request, who auth.Identity) {
		name := r.PathValue("name")
		rev, set, err := preconditions(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, "", err.Error())
			return
		}
		if !set {
			rev = 0
		}
		if err := b.DeleteEntry(r.Context(), name, rev); err != nil {
			c.backendError(w, err, "")
			return
		}
		c.Logger.Info("entry deleted", "entry", name, "source", sources.API, "actor", who.Name)
		c.record(r, who, &store.AuditRecord{Action: "delete", Entry: name})
		w.WriteHeader(http.StatusNoContent)
	}))
}

// preconditions reads If-Match (a mod revision) and If-None-Match: *
// (create only, revision 0).
func preconditions(r *http.Request) (int64, bool, error) {
	if v := r.Header.Get("If-None-Match"); v != "" {
		if strings.TrimSpace(v) != "*" {
			return 0, false, errors.New("If-None-Match supports only *")
		}
		return 0, true, nil
	}
	v := strings.TrimSpace(r.Header.Get("If-Match"))
	if v == "" {
		return 0, false, nil
	}
	v = strings.Trim(strings.TrimPrefix(v, "W/"), `"`)
	rev, err := strconv.ParseInt(v, 10, 64)
	if err != nil || rev <= 0 {
		return 0, false, fmt.Errorf("If-Match must be the entry's mod_revision, got %q", r.Header.Get("If-Match"))
	}
	return rev, true, nil
}

// readDoc reads a size-limited JSON object body and compacts it.
func readDoc(w http.ResponseWriter, r *http.Request, limit int64) (json.RawMessage, bool) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		what := "one entry"
		if limit == MaxApplyBody {
			what = "an apply (one etcd transaction, which etcd takes up to " + sizeText(EtcdMaxRequestBytes) + " by default)"
		}
		tooLarge(w, fmt.Sprintf("request body larger than %s (%d bytes), the most %s takes; send fewer or smaller entries at once", sizeText(limit), limit, what), limit)
		return nil, false
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "read body: "+err.Error())
		return nil, false
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		writeError(w, http.StatusBadRequest, "", "body is not JSON: "+err.Error())
		return nil, false
	}
	if !bytes.HasPrefix(buf.Bytes(), []byte("{")) {
		writeError(w, http.StatusUnprocessableEntity, "", "body must be a JSON object")
		return nil, false
	}
	return buf.Bytes(), true
}

func pointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func (c Config) backendError(w http.ResponseWriter, err error, base string) {
	var fe config.FieldErrors
	var de DocErrors
	switch {
	case errors.As(err, &de):
		var out []config.FieldError
		for _, n := range slices.Sorted(maps.Keys(de)) {
			for _, e := range de[n] {
				out = append(out, config.FieldError{Pointer: base + "/" + pointerToken(n) + e.Pointer, Message: e.Message})
			}
		}
		writeJSON(w, http.StatusUnprocessableEntity, apiError{Errors: out})
	case errors.As(err, &fe):
		writeJSON(w, http.StatusUnprocessableEntity, apiError{Errors: fe})
	case errors.Is(err, sources.ErrNotFound):
		writeError(w, http.StatusNotFound, "", err.Error())
	case errors.Is(err, sources.ErrPrecondition), errors.Is(err, ErrFileOwned):
		writeError(w, http.StatusConflict, "", err.Error())
	default:
		c.unavailable(w, err)
	}
}
