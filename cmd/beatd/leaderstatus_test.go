package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/beatd/beatd/api"
)

// TestMergeLeaderResultsSendsToken: where reads are guarded, the leader's
// /status needs a token, and beatd status sends BEATD_TOKEN for it.
func TestMergeLeaderResultsSendsToken(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer rd" {
			http.Error(w, "missing or unknown bearer token", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"entries": [{"name": "tick", "last_result": "ok"}]}`))
	}))
	defer leader.Close()
	st := &api.Status{Entries: []api.EntryStatus{{Name: "tick"}}}
	t.Setenv("BEATD_ADMIN_TOKEN", "")
	t.Setenv("BEATD_TOKEN", "")
	if err := mergeLeaderResults(context.Background(), st, leader.URL+"/status", "", false); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("without a token: %v, want a 401", err)
	}
	t.Setenv("BEATD_TOKEN", "rd")
	if err := mergeLeaderResults(context.Background(), st, leader.URL+"/status", "", false); err != nil {
		t.Fatal(err)
	}
	if st.Entries[0].LastResult != "ok" {
		t.Errorf("last result %q, want the leader's", st.Entries[0].LastResult)
	}
}
