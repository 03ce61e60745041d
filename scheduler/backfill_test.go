package scheduler

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
)

func TestPlanBackfill(t *testing.T) {
	cfg := mustConfig(t, `
calendars:
  xmas: ["2026-12-25"]
entries:
  weekdays: {task: t, timezone: Europe/Berlin, crontab: {minute: 0, hour: 9, day_of_week: mon-fri}, exclude: [xmas]}
  every: {task: t, every: 10m}
  rel: {task: t, every: 10m, relative: true}
  secs: {task: t, every: 1s}
  ended: {task: t, every: 1h, end_at: "2026-12-01T03:30:00Z"}
`)
	now := time.Date(2026, 12, 31, 12, 0, 0, 0, time.UTC)
	day := func(d int, h int) time.Time { return time.Date(2026, 12, d, h, 0, 0, 0, time.UTC) }
	slots := func(ps []BackfillSlot) (out []string) {
		for _, p := range ps {
			s := p.Slot.UTC().Format("01-02T15:04")
			if p.Fired {
				s += " fired"
			}
			out = append(out, s)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		entry    string
		st       *store.EntryState
		hist     []outcome.Run
		jobs     []store.Backfill
		from, to time.Time
		want     string // slots, or the error's text
	}{
		{name: "weekdays, Christmas excluded, in Berlin's winter time", entry: "weekdays", from: day(21, 0), to: day(28, 23),
			want: "12-21T08:00 12-22T08:00 12-23T08:00 12-24T08:00 12-28T08:00"},
		{name: "an interval's grid runs back before its anchor", entry: "every",
			st:   &store.EntryState{Since: time.Date(2026, 12, 31, 11, 5, 0, 0, time.UTC)},
			from: time.Date(2026, 12, 31, 10, 30, 0, 0, time.UTC), to: time.Date(2026, 12, 31, 11, 10, 0, 0, time.UTC),
			want: "12-31T10:35 12-31T10:45 12-31T10:55 12-31T11:05"},
		{name: "fired: the broker's history, the state's runs, an earlier backfill", entry: "every",
			st: &store.EntryState{Since: day(1, 0), Out: &store.Outcomes{Runs: []outcome.Run{
				{Slot: time.Date(2026, 12, 2, 0, 20, 0, 0, time.UTC), Kind: outcome.Succeeded},
				{Slot: time.Date(2026, 12, 2, 0, 30, 0, 0, time.UTC), Kind: outcome.Skipped},
			}}},
			hist: []outcome.Run{{Slot: time.Date(2026, 12, 2, 0, 10, 0, 0, time.UTC)}, {Slot: time.Date(2026, 12, 2, 0, 40, 0, 0, time.UTC), Manual: true}},
			jobs: []store.Backfill{{Entry: "every", From: day(2, 0), Cursor: day(2, 0)}, {Entry: "other", From: day(2, 0), Cursor: day(3, 0)}},
			from: day(2, 0), to: time.Date(2026, 12, 2, 0, 40, 0, 0, time.UTC),
			want: "12-02T00:00 fired 12-02T00:10 fired 12-02T00:20 fired 12-02T00:30 12-02T00:40"},
		{name: "nothing after end_at", entry: "ended", st: &store.EntryState{Since: day(1, 0)}, from: day(1, 0), to: day(1, 12),
			want: "12-01T00:00 12-01T01:00 12-01T02:00 12-01T03:00"},
		{name: "to in the future", entry: "every", from: day(31, 0), to: now.Add(time.Minute), want: "is in the future"},
		{name: "reversed", entry: "every", from: day(2, 0), to: day(1, 0), want: "must be after from"},
		{name: "wider than the cap", entry: "secs", from: day(30, 0), to: day(31, 0), want: "more than 10000 slots"},
		{name: "relative", entry: "rel", from: day(30, 0), to: day(31, 0), want: "runs relative to its last run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := cfg.Entry(tc.entry)
			got, err := PlanBackfill(BackfillInput{Entry: e, State: tc.st, History: tc.hist, Jobs: tc.jobs, From: tc.from, To: tc.to, Now: now, Cluster: "c"})
			if err != nil {
				if !errors.Is(err, ErrBackfillRange) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err = %v, want %q", err, tc.want)
				}
				return
			}
			if s := strings.Join(slots(got), " "); s != tc.want {
				t.Fatalf("slots\n got %s\nwant %s", s, tc.want)
			}
			for _, p := range got {
				if id := celery.SlotIDOf("c", tc.entry, p.Slot); p.TaskID != string(id[:]) {
					t.Errorf("%s: task id %s, want a normal fire's %s", p.Slot, p.TaskID, id[:])
				}
			}
		})
	}
}
