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
	tbl.Set(store.EntryState{Name: "partial", Since: since, LastSlot: since, Runs: 1})
	if err := store.New(cli, prefix).Save(ctx, election.Fence{Key: prefix + "leader/test", Token: resp.Header.Revision}, tbl, nil); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(cfg, []byte("entries:\n  tick: {task: t, every: 10s}\n  held: {task: t, every: 10s}\n  off: {task: t, every: 10s, enabled: false}\n"+
		"  ended: {task: t, every: 10s, end_at: \"2026-11-30T10:00:05Z\"}\n  limited: {task: t, every: 10s, relative: true, max_runs: 2}\n"+
		"  partial: {task: t, every: 10s, relative: true, max_runs: 2}\n"), 0o644); err != nil {
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
			`{"entry":"partial","at":"2026-11-30T10:00:10+00:00"}`, // one run made, one left
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
			`{"entry":"partial","at":"2026-11-30T10:00:10+00:00"}`,
			`{"entry":"partial","at":"2026-11-30T10:00:20+00:00"}`,
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

// TestNextListsOnlySlotsThatFire: `beatd next --count 10` stops where the
// leader stops firing: after max_runs slots, at end_at, and skipping the
// days of an excluded calendar (upcoming.Slots decides for both).
func TestNextListsOnlySlotsThatFire(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(cfg, []byte(`calendars:
  off-days: ["2026-12-02", "2026-12-04..2026-12-05"]
entries:
  limited: {task: t, cron: "0 * * * *", max_runs: 3}
  ended: {task: t, cron: "0 * * * *", end_at: "2026-11-30T14:30:00Z"}
  holidays: {task: t, cron: "0 9 * * *", exclude: [off-days]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, entry string
		want        []string
		wantTable   string // the table's last line
	}{
		{name: "max_runs", entry: "limited",
			want:      []string{"2026-11-30T11:00:00+00:00", "2026-11-30T12:00:00+00:00", "2026-11-30T13:00:00+00:00"},
			wantTable: "then finished: max_runs (3)"},
		{name: "end_at", entry: "ended",
			want:      []string{"2026-11-30T11:00:00+00:00", "2026-11-30T12:00:00+00:00", "2026-11-30T13:00:00+00:00", "2026-11-30T14:00:00+00:00"},
			wantTable: "then finished: end_at 2026-11-30T14:30:00+00:00"},
		{name: "calendar", entry: "holidays",
			want: []string{"2026-12-01T09:00:00+00:00", "2026-12-03T09:00:00+00:00", "2026-12-06T09:00:00+00:00", "2026-12-07T09:00:00+00:00",
				"2026-12-08T09:00:00+00:00", "2026-12-09T09:00:00+00:00", "2026-12-10T09:00:00+00:00", "2026-12-11T09:00:00+00:00",
				"2026-12-12T09:00:00+00:00", "2026-12-13T09:00:00+00:00"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"next", "--config", cfg, "--from", "2026-11-30T10:00:00Z", "--count", "10", "--entry", tt.entry}
			code, out, errs := runCLI(t, append(args, "--json")...)
			if code != 0 {
				t.Fatalf("next = %d: %s", code, errs)
			}
			var want []string
			for _, at := range tt.want {
				want = append(want, `{"entry":"`+tt.entry+`","at":"`+at+`"}`)
			}
			if got := strings.TrimSpace(out); got != strings.Join(want, "\n") {
				t.Errorf("next --json:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
			}
			code, out, errs = runCLI(t, args...)
			if code != 0 {
				t.Fatalf("next = %d: %s", code, errs)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if rows := len(lines) - 1; tt.wantTable != "" {
				if last := strings.TrimSpace(lines[rows]); last != tt.wantTable || rows-1 != len(tt.want) {
					t.Errorf("table ends %q after %d slots, want %q after %d:\n%s", last, rows-1, tt.wantTable, len(tt.want), out)
				}
			} else if rows != len(tt.want) {
				t.Errorf("table has %d slots, want %d:\n%s", rows, len(tt.want), out)
			}
		})
	}
}

// TestNextShowsChainsAndTemplates: next --json gives each slot's args and
// kwargs as its message renders them (in the entry's zone, across a DST
// change) and the chain's and callbacks' tasks; the table names the
// workflow in the task column.
func TestNextShowsChainsAndTemplates(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfg, []byte(`timezone: Europe/Berlin
entries:
  etl:
    task: etl.fetch
    crontab: {minute: 30, hour: 2}
    args: ["{{ prev_slot }}", "{{ slot }}"]
    kwargs: {day: "{{ slot.date }}", epoch: "{{ slot.epoch }}"}
    chain: [{task: etl.transform}, {task: etl.notify, immutable: true}]
    link_error: {task: etl.alert}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"next", "--config", cfg, "--from", "2026-03-28T00:00:00Z", "--count", "2"}
	code, out, errs := runCLI(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("next --json = %d: %s", code, errs)
	}
	want := `{"entry":"etl","at":"2026-03-28T02:30:00+01:00","args":["2026-03-27T02:30:00+01:00","2026-03-28T02:30:00+01:00"],"kwargs":{"day":"2026-03-28","epoch":1774661400},"chain":["etl.fetch","etl.transform","etl.notify"],"link_error":["etl.alert"]}
{"entry":"etl","at":"2026-03-29T03:00:00+02:00","args":["2026-03-28T02:30:00+01:00","2026-03-29T03:00:00+02:00"],"kwargs":{"day":"2026-03-29","epoch":1774746000},"chain":["etl.fetch","etl.transform","etl.notify"],"link_error":["etl.alert"]}`
	if got := strings.TrimSpace(out); got != want {
		t.Errorf("next --json:\n%s\nwant:\n%s", got, want)
	}
	code, out, errs = runCLI(t, args...)
	if code != 0 || !strings.Contains(out, "etl.fetch → etl.transform → etl.notify; link_error: etl.alert") {
		t.Errorf("next = %d (%s): the table does not name the workflow:\n%s", code, errs, out)
	}
}
