package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/status"
)

// TestEntriesTableAcrossShards: on a sharded cluster the entries table
// is the cluster's, soonest next fire first, paged across the replicas
// that lead the shards: this replica's rows and the other's interleave
// by next fire, each row rendered as its own replica renders it, the
// counts are the sum, and a shard whose entries cannot be listed is
// named.
func TestEntriesTableAcrossShards(t *testing.T) {
	// Just past a midnight, every interval below (a divisor of a day)
	// next fires at midnight plus itself.
	now := time.Date(2026, 12, 6, 0, 0, 0, 500_000_000, time.UTC)
	clock := clockwork.NewFakeClockAt(now)
	table := func(secs ...int) *config.Config {
		cfg := &config.Config{File: "s.yaml"}
		for _, s := range secs {
			cfg.Entries = append(cfg.Entries, every(fmt.Sprintf("e%02d", s), fmt.Sprintf("tasks.t%d", s), time.Duration(s)*time.Second))
		}
		return cfg
	}
	_, remote := testServerWith(t, func(c *Config) { c.Clock, c.ID = clock, "b" }, table(2, 4, 6, 9, 12))
	local, _ := testServerWith(t, func(c *Config) {
		c.Clock, c.PageSize = clock, 3
		c.LedShards = func() []LedShard { return nil }
	}, table(1, 3, 5, 8, 10))
	replicas := []election.Replica{{ID: "unit", HTTP: "127.0.0.1:1"}, {ID: "b", HTTP: remote.URL}}
	shards := []status.ShardStatus{{Shard: 0, LeaderID: "unit", FencingToken: 7}, {Shard: 1, LeaderID: "b", FencingToken: 8}}
	ctx := context.Background()
	names := func(ev *entriesView) []string {
		var out []string
		for _, r := range ev.Rows {
			out = append(out, r.Name)
		}
		return out
	}
	for _, tc := range []struct {
		q       query
		want    []string
		matched int
	}{
		{query{In: "all", Page: 1}, []string{"e01", "e02", "e03"}, 10},
		{query{In: "all", Page: 2}, []string{"e04", "e05", "e06"}, 10},
		{query{In: "all", Page: 4}, []string{"e12"}, 10},
		{query{In: "all", Page: 9}, []string{"e12"}, 10}, // past the end: the last
		{query{Q: "tasks.t1", In: "task", Page: 1}, []string{"e01", "e10", "e12"}, 3},
	} {
		ev := local.entriesPage(ctx, tc.q, now, shards, replicas)
		if got := names(ev); !slices.Equal(got, tc.want) || ev.Total != 10 || ev.Matched != tc.matched || ev.Missing != "" {
			t.Errorf("%+v: rows %v, %d of %d (missing %q); want %v, %d of 10", tc.q, got, ev.Matched, ev.Total, ev.Missing, tc.want, tc.matched)
		}
	}
	// The other replica's rows say what its own console says of them.
	ev := local.entriesPage(ctx, query{In: "all", Page: 1}, now, shards, replicas)
	if r := ev.Rows[1]; r.Task != "tasks.t2" || r.Queue != "celery" || r.ScheduleWords == "" || !r.Next.Equal(now.Truncate(time.Second).Add(2*time.Second)) {
		t.Errorf("the other replica's row: %+v", r)
	}
	// A shard without a leader, and a leader that does not answer.
	gone := httptest.NewServer(nil)
	gone.Close()
	lost := append(slices.Clone(shards), status.ShardStatus{Shard: 2}, status.ShardStatus{Shard: 3, LeaderID: "c", FencingToken: 9})
	ev = local.entriesPage(ctx, query{In: "all", Page: 1}, now, lost, append(replicas, election.Replica{ID: "c", HTTP: gone.URL}))
	if got := names(ev); !slices.Equal(got, []string{"e01", "e02", "e03"}) || ev.Total != 10 ||
		!strings.Contains(ev.Missing, "shard 2: no leader") || !strings.Contains(ev.Missing, "shard 3: leader c at ") {
		t.Errorf("with shard 2 unled and 3's leader gone: rows %v, %d entries, missing %q", got, ev.Total, ev.Missing)
	}
	// Bounds: a part is at most maxRowsLimit keys, a render a page's
	// names.
	many := strings.Repeat("&name=x", maxRenderRows+1)
	for _, q := range []string{"limit=abc", "limit=-1", fmt.Sprintf("limit=%d", maxRowsLimit+1), many[1:]} {
		if code, body := get(t, remote.URL+"/console/rows.json?"+q); code != http.StatusBadRequest {
			t.Errorf("GET /console/rows.json?%.40s: %d %s, want 400", q, code, body)
		}
	}
}
