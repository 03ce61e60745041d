package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestNextReadsState: with --etcd-endpoints, `beatd next` answers as the
// leader runs each entry: an interval on the grid its state anchors, a
// paused entry flagged with no times, a finished one (end_at, max_runs)
// said to be finished; a disabled one is flagged either way. Without etcd, the interval is anchored at --from.
func TestNextReadsState(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	ctx := context.Background()
	const prefix = "/beatd/nexttest/"
	// A leader key whose create revision is the token that guards writes.
	resp, err := cli.Put(ctx, prefix+"leader/test", "x")
	if err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 30, 9, 59, 53, 0, time.UTC) // off the epoch grid
	tbl := store.NewTable()
	tbl.Set(store.EntryState{Name: "tick", Since: since})
	tbl.Set(store.EntryState{Name: "held", Since: since, Paused: true})
	tbl.Set(store.EntryState{Name: "limited", Since: since, LastSlot: since, Runs: 2})
	if err := store.New(cli, prefix).Save(ctx, election.Fence{Key: prefix + "leader/test", Token: resp.Header.Revision}, tbl, nil); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(cfg, []byte("entries:\n  tick: {task: t, every: 10s}\n  held: {task: t, every: 10s}\n  off: {task: t, every: 10s, enabled: false}\n"+
		"  ended: {task: t, every: 10s, end_at: \"2026-11-30T10:00:05Z\"}\n  limited: {task: t, every: 10s, relative: true, max_runs: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	from := "2026-11-30T10:00:00Z"
	for _, tc := range []struct {
		name string
		etcd bool
		want []string
	}{
		{"from state", true, []string{
			`{"entry":"ended","finished":"end_at 2026-11-30T10:00:05+00:00"}`,
			`{"entry":"held","paused":true}`,
			`{"entry":"limited","finished":"made its max_runs (2)"}`,
			`{"entry":"off","disabled":true}`,
			`{"entry":"tick","at":"2026-11-30T10:00:03+00:00"}`,
			`{"entry":"tick","at":"2026-11-30T10:00:13+00:00"}`,
		}},
		{"config only", false, []string{
			`{"entry":"ended","finished":"end_at 2026-11-30T10:00:05+00:00"}`,
			`{"entry":"held","at":"2026-11-30T10:00:10+00:00"}`,
			`{"entry":"held","at":"2026-11-30T10:00:20+00:00"}`,
			`{"entry":"limited","at":"2026-11-30T10:00:10+00:00"}`,
			`{"entry":"limited","at":"2026-11-30T10:00:20+00:00"}`,
			`{"entry":"off","disabled":true}`,
			`{"entry":"tick","at":"2026-11-30T10:00:10+00:00"}`,
			`{"entry":"tick","at":"2026-11-30T10:00:20+00:00"}`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"next", "--config", cfg, "--from", from, "--count", "2", "--json"}
			if tc.etcd {
				args = append(args, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", prefix)
			}
			code, out, errs := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("next = %d: %s", code, errs)
			}
			want := strings.Join(tc.want, "\n")
			if got := strings.TrimSpace(out); got != want {
				t.Errorf("next:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
