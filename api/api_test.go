package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/beatd/beatd/auth"
	"github.com/prometheus/client_golang/prometheus"
)

type fakeBackend struct {
	aliveErr, readyErr error
	requests           []string
	actions            []Action
}

func (f *fakeBackend) Alive() error                { return f.aliveErr }
func (f *fakeBackend) Ready(context.Context) error { return f.readyErr }
func (f *fakeBackend) Status(context.Context, StatusQuery) (Status, error) {
	return Status{ID: "a", Leader: true, LeaderID: "a", FencingToken: 7, Entries: []EntryStatus{{Name: "e"}}}, nil
}
func (f *fakeBackend) Request(_ context.Context, a Action) (string, error) {
	if a.Entry != "e" {
		return "", ErrUnknownEntry
	}
	f.requests = append(f.requests, a.Op+" "+a.Entry)
	f.actions = append(f.actions, a)
	return "req-1", nil
}

// adminOnly is the tokens of a cluster with only --admin-token-file.
func adminOnly(t *testing.T, token string) *auth.Tokens {
	t.Helper()
	tk, err := auth.New(auth.Options{Admin: token})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestAdminAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		token  string // configured
		auth   string // sent
		path   string
		want   int
		wantOp bool
	}{
		{name: "right token", token: "s3cret", auth: "Bearer s3cret", path: "/entries/e/trigger", want: http.StatusAccepted, wantOp: true},
		{name: "wrong token", token: "s3cret", auth: "Bearer nope", path: "/entries/e/pause", want: http.StatusUnauthorized},
		{name: "no token sent", token: "s3cret", path: "/entries/e/resume", want: http.StatusUnauthorized},
		{name: "not configured", token: "", auth: "Bearer anything", path: "/entries/e/trigger", want: http.StatusForbidden},
		{name: "unknown entry", token: "s3cret", auth: "Bearer s3cret", path: "/entries/zz/trigger", want: http.StatusNotFound},
		{name: "unknown op", token: "s3cret", auth: "Bearer s3cret", path: "/entries/e/explode", want: http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBackend{}
			h := Handler(Config{Backend: b, Gatherer: prometheus.NewRegistry(), Tokens: adminOnly(t, tt.token)})
			req := httptest.NewRequest("POST", tt.path, nil)
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.want, rec.Body)
			}
			if got := len(b.requests) == 1; got != tt.wantOp {
				t.Errorf("requests = %v", b.requests)
			}
		})
	}
}

func TestHealthAndStatus(t *testing.T) {
	t.Parallel()
	b := &fakeBackend{readyErr: errors.New("broker: connection refused")}
	h := Handler(Config{Backend: b, Gatherer: prometheus.NewRegistry()})
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, "/status": 200, "/metrics": 200} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Errorf("%s: %d, want %d", path, rec.Code, want)
		}
		if path == "/status" && !strings.Contains(rec.Body.String(), `"fencing_token": 7`) {
			t.Errorf("status body: %s", rec.Body)
		}
		if path == "/readyz" && !strings.Contains(rec.Body.String(), "broker") {
			t.Errorf("readyz does not say why: %s", rec.Body)
		}
	}
}
