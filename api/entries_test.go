package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/beatd/beatd/auth"
	"github.com/prometheus/client_golang/prometheus"
)

type fakeEntries struct {
	EntriesBackend
	ifMatch map[string]int64
}

func (f *fakeEntries) ListEntries(context.Context, ListQuery) (Page, error) {
	return Page{Entries: []Entry{{Name: "e"}}}, nil
}
func (f *fakeEntries) PutEntries(_ context.Context, _ []EntryDoc, ifMatch map[string]int64) (int64, error) {
	f.ifMatch = ifMatch
	return 7, nil
}

// TestEntriesAuthAndPreconditions checks the token rules and how the
// conditional headers reach the backend.
func TestEntriesAuthAndPreconditions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, method, auth, readToken, adminToken string
		hdr                                       [2]string
		want                                      int
		wantIfMatch                               string // "" none, else "name=rev"
	}{
		{name: "open read", method: "GET", adminToken: "adm", want: 200},
		{name: "read token required", method: "GET", readToken: "rd", adminToken: "adm", want: 401},
		{name: "read token", method: "GET", auth: "Bearer rd", readToken: "rd", adminToken: "adm", want: 200},
		{name: "admin reads", method: "GET", auth: "Bearer adm", readToken: "rd", adminToken: "adm", want: 200},
		{name: "read token cannot write", method: "PUT", auth: "Bearer rd", readToken: "rd", adminToken: "adm", want: 403},
		{name: "writes disabled", method: "PUT", auth: "Bearer x", want: 403},
		{name: "token prefix is not the token", method: "PUT", auth: "Bearer ad", adminToken: "adm", want: 401},
		{name: "unconditional", method: "PUT", auth: "Bearer adm", adminToken: "adm", want: 200},
		{name: "if-match quoted", method: "PUT", auth: "Bearer adm", adminToken: "adm", hdr: [2]string{"If-Match", `"42"`}, want: 200, wantIfMatch: "e=42"},
		{name: "if-match weak", method: "PUT", auth: "Bearer adm", adminToken: "adm", hdr: [2]string{"If-Match", `W/"42"`}, want: 200, wantIfMatch: "e=42"},
		{name: "if-none-match", method: "PUT", auth: "Bearer adm", adminToken: "adm", hdr: [2]string{"If-None-Match", "*"}, want: 200, wantIfMatch: "e=0"},
		{name: "bad if-match", method: "PUT", auth: "Bearer adm", adminToken: "adm", hdr: [2]string{"If-Match", "abc"}, want: 400},
		{name: "zero if-match", method: "PUT", auth: "Bearer adm", adminToken: "adm", hdr: [2]string{"If-Match", "0"}, want: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fe := &fakeEntries{}
			tk, err := auth.New(auth.Options{Admin: tt.adminToken, Read: tt.readToken})
			if err != nil {
				t.Fatal(err)
			}
			h := Handler(Config{Backend: &fakeBackend{}, Gatherer: prometheus.NewRegistry(), Entries: fe, Tokens: tk})
			path := "/api/v1/entries"
			var body string
			if tt.method == "PUT" {
				path, body = path+"/e", `{"task":"t","every":1}`
			}
			req := httptest.NewRequest(tt.method, path, strings.NewReader(body))
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			if tt.hdr[0] != "" {
				req.Header.Set(tt.hdr[0], tt.hdr[1])
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.want, rec.Body)
			}
			if rec.Code >= 400 && !strings.Contains(rec.Body.String(), `"pointer"`) {
				t.Errorf("error body is not the JSON error shape: %s", rec.Body)
			}
			got := ""
			for k, v := range fe.ifMatch {
				got = k + "=" + strconv.FormatInt(v, 10)
			}
			if got != tt.wantIfMatch {
				t.Errorf("if-match %q, want %q", got, tt.wantIfMatch)
			}
			if tt.method == "PUT" && rec.Code == http.StatusOK && rec.Header().Get("ETag") != `"7"` {
				t.Errorf("ETag %q", rec.Header().Get("ETag"))
			}
		})
	}
}

func TestEntriesApplyLimits(t *testing.T) {
	t.Parallel()
	h := Handler(Config{Backend: &fakeBackend{}, Gatherer: prometheus.NewRegistry(), Entries: &fakeEntries{}, Tokens: adminOnly(t, "adm")})
	body := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `"e` + strconv.Itoa(i) + `": {"task": "t", "every": 1}`
		}
		return `{"entries": {` + strings.Join(parts, ",") + `}}`
	}
	for _, tt := range []struct {
		name, body string
		want       int
	}{
		{"at the limit", body(MaxApplyEntries), 200},
		{"over the limit", body(MaxApplyEntries + 1), 422},
		{"empty", `{"entries": {}}`, 422},
		{"not a set", `[1]`, 422},
	} {
		req := httptest.NewRequest("POST", "/api/v1/entries", strings.NewReader(tt.body))
		req.Header.Set("Authorization", "Bearer adm")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.want {
			t.Errorf("%s: %d, want %d: %s", tt.name, rec.Code, tt.want, rec.Body)
		}
	}
}
