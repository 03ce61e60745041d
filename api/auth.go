package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/store"
)

// ClientHeader names the client that sent a change (cli, console); the
// audit records it as the change's via. Anything else is "api".
const ClientHeader = "X-Beatd-Client"

// NoteHeader carries a change's note where the body is the entry itself
// (the entries API); ?note= does too.
const NoteHeader = "X-Beatd-Note"

// MaxNote is the longest note kept.
const MaxNote = 1024

func via(r *http.Request) string {
	switch v := r.Header.Get(ClientHeader); v {
	case "cli", "console":
		return v
	}
	return "api"
}

// noteOf is the note of a change: the body's, else ?note=, else the
// header's; cut to MaxNote.
func noteOf(r *http.Request, body string) string {
	n := body
	if n == "" {
		n = r.URL.Query().Get("note")
	}
	if n == "" {
		n = r.Header.Get(NoteHeader)
	}
	n = strings.TrimSpace(n)
	if len(n) > MaxNote {
		n = n[:MaxNote]
	}
	return n
}

// readOptional decodes an optional JSON object body into v: an empty body
// is fine.
func readOptional(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxEntryBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "read body: "+err.Error())
		return false
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return true
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			writeError(w, http.StatusUnprocessableEntity, "/"+strings.ReplaceAll(ute.Field, ".", "/"), fmt.Sprintf("want a %s, got %s", ute.Type, ute.Value))
			return false
		}
		writeError(w, http.StatusBadRequest, "", "body: "+err.Error())
		return false
	}
	return true
}

// roleHandler is a handler that knows who asked.
type roleHandler func(w http.ResponseWriter, r *http.Request, who auth.Identity)

// need guards h with a role, by the one check (auth.Tokens.Check) the
// console's pages take too: reads are open unless Tokens.Guarded; every
// other role needs a token holding it: none configured is 403, a missing
// or unknown token 401, a token of a lesser role 403.
func (c Config) need(role auth.Role, h roleHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, err := c.Tokens.Check(r, role)
		if err != nil {
			code := auth.Status(err)
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="beatd"`)
			}
			writeError(w, code, "", err.Error())
			return
		}
		h(w, r, who)
	}
}

// read guards a read.
func (c Config) read(h http.HandlerFunc) http.HandlerFunc {
	return c.need(auth.RoleRead, func(w http.ResponseWriter, r *http.Request, _ auth.Identity) { h(w, r) })
}

// write guards a change to the entries: the admin role.
func (c Config) write(h roleHandler) http.HandlerFunc { return c.need(auth.RoleAdmin, h) }

// Auditor keeps the audit trail (store.Store).
type Auditor interface {
	Audit(ctx context.Context, rec store.AuditRecord) error
	AuditLog(ctx context.Context, entry string, limit int) ([]store.AuditRecord, error)
}

// record stores the audit record of a change that succeeded. A failure
// is logged: the change is made, and refusing to say so would be worse.
func (c Config) record(r *http.Request, who auth.Identity, rec *store.AuditRecord) {
	if c.Ops == nil {
		return
	}
	rec.Actor, rec.Role, rec.Via, rec.At = who.Name, who.Role.String(), via(r), c.Now()
	if rec.Note == "" {
		rec.Note = noteOf(r, "")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if err := c.Ops.Audit(ctx, *rec); err != nil {
		c.Logger.Error("audit record not written", "action", rec.Action, "entry", rec.Entry, "actor", who.Name, "err", err)
	}
}
