package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/store"
	"github.com/prometheus/client_golang/prometheus"
)

type fakeOps struct {
	audit []store.AuditRecord
	plans []BackfillSpec
}

func (f *fakeOps) Audit(_ context.Context, r store.AuditRecord) error {
	f.audit = append(f.audit, r)
	return nil
}
func (f *fakeOps) AuditLog(context.Context, string, int) ([]store.AuditRecord, error) {
	return f.audit, nil
}
func (f *fakeOps) Backfill(_ context.Context, s BackfillSpec, a Action) (BackfillAnswer, error) {
	f.plans = append(f.plans, s)
	return BackfillAnswer{Entry: a.Entry, Job: &store.Backfill{ID: "bf-1"}}, nil
}
func (f *fakeOps) Backfills(context.Context) ([]store.Backfill, error) { return nil, nil }
func (f *fakeOps) CancelBackfill(context.Context, string, Action) error {
	return nil
}

func tokensFile(t *testing.T, names map[string]string) *auth.Tokens {
	t.Helper()
	var b strings.Builder
	b.WriteString("tokens:\n")
	for name, role := range names {
		b.WriteString("  " + name + ": {role: " + role + ", sha256: " + auth.Hash("tok-"+name) + "}\n")
	}
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := auth.New(auth.Options{File: p, Admin: "legacy-admin"})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestRoles checks each role against each kind of route: allowed, or
// refused with 401 (no or unknown token) or 403 (a lesser role).
func TestRoles(t *testing.T) {
	t.Parallel()
	tk := tokensFile(t, map[string]string{"reader": "read", "ops": "operate", "boss": "admin"})
	routes := []struct {
		name, method, path, body string
		role                     auth.Role
		ok                       int
	}{
		{"status", "GET", "/status", "", auth.RoleRead, 200},
		{"list entries", "GET", "/api/v1/entries", "", auth.RoleRead, 200},
		{"audit", "GET", "/api/v1/audit", "", auth.RoleRead, 200},
		{"backfills", "GET", "/api/v1/backfills", "", auth.RoleRead, 200},
		{"pause", "POST", "/entries/e/pause", `{"note":"db migration"}`, auth.RoleOperate, 202},
		{"trigger v1", "POST", "/api/v1/entries/e/trigger", "", auth.RoleOperate, 202},
		{"backfill", "POST", "/api/v1/entries/e/backfill", `{"from":"2026-11-01T00:00:00Z","to":"2026-11-02T00:00:00Z"}`, auth.RoleOperate, 202},
		{"cancel backfill", "DELETE", "/api/v1/backfills/bf-1", "", auth.RoleOperate, 202},
		{"put entry", "PUT", "/api/v1/entries/e", `{"task":"t","every":1}`, auth.RoleAdmin, 200},
		{"delete entry", "DELETE", "/api/v1/entries/e", "", auth.RoleAdmin, 204},
		{"heap profile", "GET", "/debug/pprof/heap", "", auth.RoleAdmin, 200},
		{"profile index", "GET", "/debug/pprof/", "", auth.RoleAdmin, 200},
	}
	callers := []struct {
		token string
		role  auth.Role
	}{
		{"", auth.RoleNone},
		{"tok-nobody", auth.RoleNone},
		{"tok-reader", auth.RoleRead},
		{"tok-ops", auth.RoleOperate},
		{"tok-boss", auth.RoleAdmin},
		{"legacy-admin", auth.RoleAdmin},
	}
	for _, rt := range routes {
		for _, c := range callers {
			t.Run(rt.name+"/"+c.token, func(t *testing.T) {
				ops := &fakeOps{}
				h := Handler(Config{Backend: &fakeBackend{}, Gatherer: prometheus.NewRegistry(), Entries: &fakeEntries{}, Ops: ops, Tokens: tk})
				req := httptest.NewRequest(rt.method, rt.path, strings.NewReader(rt.body))
				if c.token != "" {
					req.Header.Set("Authorization", "Bearer "+c.token)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				want := rt.ok
				switch {
				case c.role >= rt.role:
				case c.role == auth.RoleNone:
					want = http.StatusUnauthorized
				default:
					want = http.StatusForbidden
				}
				if rec.Code != want {
					t.Fatalf("%s %s as %q: %d, want %d: %s", rt.method, rt.path, c.token, rec.Code, want, rec.Body)
				}
				if want == http.StatusForbidden && !strings.Contains(rec.Body.String(), "needs "+rt.role.String()) {
					t.Errorf("a refusal must say the role it needs: %s", rec.Body)
				}
			})
		}
	}
}

// TestAuditNames checks that a change is recorded under the token's name,
// with where it came from and its note.
func TestAuditNames(t *testing.T) {
	t.Parallel()
	tk := tokensFile(t, map[string]string{"alice": "admin"})
	ops := &fakeOps{}
	b := &fakeBackend{}
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	h := Handler(Config{Backend: b, Gatherer: prometheus.NewRegistry(), Entries: &fakeEntries{}, Ops: ops, Tokens: tk, Now: func() time.Time { return now }})
	do := func(method, path, body string, hdr ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok-alice")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := do("POST", "/entries/e/pause", `{"note":"vendor outage"}`, ClientHeader, "console"); rec.Code != 202 {
		t.Fatalf("pause: %d %s", rec.Code, rec.Body)
	}
	if got := b.actions[0]; got.Who.Name != "alice" || got.Note != "vendor outage" || got.Via != "console" {
		t.Errorf("pause action = %+v", got)
	}
	if rec := do("PUT", "/api/v1/entries/e?note=new+owner", `{"task":"t","every":1}`, ClientHeader, "cli"); rec.Code != 200 {
		t.Fatalf("put: %d %s", rec.Code, rec.Body)
	}
	if len(ops.audit) != 1 {
		t.Fatalf("audit = %+v", ops.audit)
	}
	if r := ops.audit[0]; r.Actor != "alice" || r.Role != "admin" || r.Via != "cli" || r.Action != "put" || r.Entry != "e" || r.Note != "new owner" || !r.At.Equal(now) {
		t.Errorf("put record = %+v", r)
	}
}

// TestRequireNotes checks that a pause without a note is refused, with a
// JSON pointer, when notes are required, and that other actions are not.
func TestRequireNotes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		path, body string
		want       int
	}{
		{"/entries/e/pause", "", 422},
		{"/entries/e/pause", `{"note":"   "}`, 422},
		{"/entries/e/pause", `{"note":"maintenance"}`, 202},
		{"/entries/e/pause?note=maintenance", "", 202},
		{"/entries/e/resume", "", 202},
		{"/entries/e/pause", `{"note": 5}`, 422},
		{"/entries/e/pause", `{"nope": 1}`, 400},
	} {
		b := &fakeBackend{}
		h := Handler(Config{Backend: b, Gatherer: prometheus.NewRegistry(), Tokens: adminOnly(t, "adm"), RequireNotes: true})
		req := httptest.NewRequest("POST", tt.path, strings.NewReader(tt.body))
		req.Header.Set("Authorization", "Bearer adm")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.want {
			t.Errorf("%s %s: %d, want %d: %s", tt.path, tt.body, rec.Code, tt.want, rec.Body)
		}
		if tt.want == 422 && !strings.Contains(rec.Body.String(), `"pointer": "/note"`) {
			t.Errorf("%s %s: no /note pointer: %s", tt.path, tt.body, rec.Body)
		}
	}
}

func (f *fakeEntries) DeleteEntry(context.Context, string, int64) error { return nil }

// TestCookieReadsOnly: the console's sign-in cookie is good for reads (the
// same check as a bearer token), never for an action, so a page of
// another site that gets a browser to send it can change nothing.
func TestCookieReadsOnly(t *testing.T) {
	t.Parallel()
	tk := tokensFile(t, map[string]string{"boss": "admin"})
	h := Handler(Config{Backend: &fakeBackend{}, Gatherer: prometheus.NewRegistry(), Entries: &fakeEntries{}, Ops: &fakeOps{}, Tokens: tk})
	cookie := func() *http.Cookie {
		rec := httptest.NewRecorder()
		auth.SetCookie(rec, httptest.NewRequest("POST", "/console/login", nil), "tok-boss")
		return rec.Result().Cookies()[0]
	}()
	tests := []struct {
		name, method, path string
		want               int
	}{
		{"list entries", "GET", "/api/v1/entries", 200},
		{"status", "GET", "/status", 200},
		{"audit", "GET", "/api/v1/audit", 200},
		{"trigger", "POST", "/entries/e/trigger", 401},
		{"delete entry", "DELETE", "/api/v1/entries/e", 401},
		{"heap profile", "GET", "/debug/pprof/heap", 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, tt.path, nil)
			req.AddCookie(cookie)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("%s %s with the cookie: %d, want %d: %s", tt.method, tt.path, rec.Code, tt.want, rec.Body)
			}
		})
	}
}
