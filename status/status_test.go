package status

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
)

var now = time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse("s.yaml", []byte(`entries:
  tick: {task: tasks.tick, every: 1m}
  three: {task: tasks.three, cron: "0 * * * *", max_runs: 3, overlap: skip}
  etl: {task: etl.fetch, every: 1m, chain: [{task: etl.transform}, {task: etl.load}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestOf: one entry's status says what its definition, its state and
// its runs say, whoever builds it.
func TestOf(t *testing.T) {
	cfg := testConfig(t)
	slot := now.Add(-30 * time.Second)
	done := &store.Outcomes{Failures: 2, LastFailure: slot.Add(time.Second), PauseReason: "ValueError: no",
		Runs: []outcome.Run{
			{Slot: now, Kind: outcome.Skipped, PublishedAt: now, Skips: 3},
			{Slot: slot, Kind: outcome.Failed, PublishedAt: slot, Runtime: 1500 * time.Millisecond, Worker: "w1", ExcType: "ValueError", ExcMsg: "no"},
			{Slot: slot.Add(-time.Minute), Manual: true, TaskID: "manual-id", Kind: outcome.Succeeded, PublishedAt: slot.Add(-time.Minute)},
		}}
	hist := &outcome.EntryRuns{Count: 7, Runs: []outcome.Run{{Slot: slot, PublishedAt: slot.Add(time.Millisecond), TaskID: "t1"}}}
	tests := []struct {
		name  string
		facts Facts
		check func(t *testing.T, e Entry)
	}{
		{"definition only", Facts{Name: "tick", Entry: cfg.Entry("tick")}, func(t *testing.T, e Entry) {
			if e.Source != sources.File || e.Task != "tasks.tick" || !e.Enabled || e.ScheduleWords == "" || e.Schedule == "" {
				t.Errorf("definition fields: %+v", e)
			}
			if e.NextRunAt == nil || !e.NextRunAt.After(now) || e.RemainingRuns != nil || e.Overlap != "" {
				t.Errorf("next %v, remaining %v, overlap %q", e.NextRunAt, e.RemainingRuns, e.Overlap)
			}
			if e.RecentRuns == nil || len(e.RecentRuns) != 0 || !e.LastFire.At.IsZero() {
				t.Errorf("runs %v, last fire %+v: want none (and [] on the wire)", e.RecentRuns, e.LastFire)
			}
		}},
		{"paused, with outcomes and runs", Facts{Name: "three", Entry: cfg.Entry("three"), Cluster: "c",
			State: &store.EntryState{Name: "three", Paused: true, LastSlot: slot, Runs: 1, Out: done}, History: hist}, func(t *testing.T, e Entry) {
			if !e.Paused || e.NextRunAt != nil || e.LastSlot == nil || !e.LastSlot.Equal(slot) {
				t.Errorf("paused %v next %v last slot %v", e.Paused, e.NextRunAt, e.LastSlot)
			}
			if e.RemainingRuns == nil || *e.RemainingRuns != 2 || e.Overlap != "skip" {
				t.Errorf("remaining %v overlap %q", e.RemainingRuns, e.Overlap)
			}
			if e.TotalRunCount != 7 || e.LastRunAt == nil || !e.LastRunAt.Equal(slot.Add(time.Millisecond)) || len(e.RecentRuns) != 1 {
				t.Errorf("history: count %d last %v runs %v", e.TotalRunCount, e.LastRunAt, e.RecentRuns)
			}
			if e.LastFire.Result != "published" || !e.LastFire.At.Equal(slot.Add(time.Millisecond)) {
				t.Errorf("last fire %+v", e.LastFire)
			}
			if e.ConsecutiveFailures != 2 || e.PauseReason != "ValueError: no" || e.Running || e.LastFailureAt == nil || e.LastSuccessAt != nil {
				t.Errorf("outcomes %+v", e.Outcomes)
			}
			sid := celery.SlotIDOf("c", "three", slot)
			want := []RunOutcome{
				{Slot: now, Outcome: "skipped", PublishedAt: now, SkippedSlots: 3},
				{Slot: slot, TaskID: string(sid[:]), Outcome: "failed", PublishedAt: slot, RuntimeSeconds: 1.5, Worker: "w1", Exception: "ValueError", Message: "no"},
				{Slot: slot.Add(-time.Minute), TaskID: "manual-id", Manual: true, Outcome: "succeeded", PublishedAt: slot.Add(-time.Minute)},
			}
			if !slices.EqualFunc(e.Runs, want, func(a, b RunOutcome) bool {
				ja, _ := json.Marshal(a)
				jb, _ := json.Marshal(b)
				return string(ja) == string(jb)
			}) {
				t.Errorf("runs\n got %+v\nwant %+v", e.Runs, want)
			}
			if e.LastOutcome() != "failed" {
				t.Errorf("LastOutcome = %q, want failed (the newest not skipped)", e.LastOutcome())
			}
		}},
		{"removed entry", Facts{Name: "gone", State: &store.EntryState{Name: "gone", LastSlot: slot}}, func(t *testing.T, e Entry) {
			if e.Name != "gone" || e.Source != "" || e.NextRunAt != nil || e.LastSlot == nil {
				t.Errorf("%+v", e)
			}
		}},
		{"chained runs", Facts{Name: "etl", Entry: cfg.Entry("etl"), State: &store.EntryState{Name: "etl",
			Out: &store.Outcomes{Runs: []outcome.Run{
				{Slot: now, Kind: outcome.Started, Chain: 2, Step: 2},
				{Slot: slot, Kind: outcome.Failed, Chain: 2, Step: 1, ExcType: "ValueError", ExcMsg: "no"},
				{Slot: slot.Add(-time.Minute), Kind: outcome.Succeeded, Chain: 2, Step: 2},
			}}}}, func(t *testing.T, e Entry) {
			got := make([]string, len(e.Runs))
			for i := range e.Runs {
				got[i] = e.Runs[i].OutcomeText() + " | " + e.Runs[i].Step
			}
			want := []string{"started, step 3/3 etl.load | step 3/3 etl.load", "failed at step 2/3 etl.transform | step 2/3 etl.transform", "succeeded | "}
			if !slices.Equal(got, want) || !e.Running {
				t.Errorf("runs %q (running %v), want %q", got, e.Running, want)
			}
		}},
		{"chained run of a changed chain", Facts{Name: "etl", Entry: cfg.Entry("etl"), State: &store.EntryState{Name: "etl",
			Out: &store.Outcomes{Runs: []outcome.Run{{Slot: slot, Kind: outcome.Lost, Chain: 3, Step: 1}}}}}, func(t *testing.T, e Entry) {
			if got := e.Runs[0].OutcomeText(); got != "lost at step 2/4" {
				t.Errorf("outcome %q, want the step without a task it may no longer be", got)
			}
		}},
		{"running", Facts{Name: "tick", Entry: cfg.Entry("tick"), State: &store.EntryState{Name: "tick",
			Out: &store.Outcomes{Runs: []outcome.Run{{Slot: slot, Kind: outcome.Started}}}}}, func(t *testing.T, e Entry) {
			if !e.Running {
				t.Error("a started run is running")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, Of(tt.facts, now)) })
	}
}

// TestOverlay: the leader's live results replace what etcd cannot know,
// a next fire only where one is due, and the newest fire only when newer.
func TestOverlay(t *testing.T) {
	at := func(s int) time.Time { return now.Add(time.Duration(s) * time.Second) }
	ptr := func(t time.Time) *time.Time { return &t }
	tests := []struct {
		name     string
		entry    Entry
		live     Live
		next     *time.Time
		fire     Fire
		result   string
		errorAt  *time.Time
		resultTx string
	}{
		{name: "results and due next", entry: Entry{Name: "e", NextRunAt: ptr(at(60))},
			live: Live{Result: "error", Error: "boom", ErrorAt: at(-1), NextFireAt: at(-5), Health: "behind", HealthReason: "slow"},
			next: ptr(at(-5)), result: "error", errorAt: ptr(at(-1)), resultTx: "error (behind)"},
		{name: "no next while paused", entry: Entry{Name: "e"}, live: Live{Result: "ok", NextFireAt: at(5)}, result: "ok", resultTx: "ok"},
		{name: "newer fire", entry: Entry{Name: "e", LastFire: Fire{At: at(-10), Result: "published"}},
			live: Live{Result: "duplicate", FireAt: at(-1), Manual: true}, fire: Fire{At: at(-1), Result: "duplicate (manual)"}, result: "duplicate", resultTx: "duplicate"},
		{name: "older fire kept", entry: Entry{Name: "e", LastFire: Fire{At: at(-1), Result: "published"}},
			live: Live{Result: "ok", FireAt: at(-10)}, fire: Fire{At: at(-1), Result: "published"}, result: "ok", resultTx: "ok"},
		{name: "health alone", entry: Entry{Name: "e"}, live: Live{Health: "runaway"}, resultTx: "runaway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := View{Entries: []Entry{tt.entry, {Name: "other", LastResult: "kept"}}}
			v.Overlay(map[string]Live{"e": tt.live})
			e := v.Entries[0]
			if e.LastResult != tt.result || e.ResultText() != tt.resultTx || !samePtr(e.NextRunAt, tt.next) || !samePtr(e.LastErrorAt, tt.errorAt) || e.LastFire != tt.fire {
				t.Errorf("got result %q (%q) next %v errorAt %v fire %+v", e.LastResult, e.ResultText(), e.NextRunAt, e.LastErrorAt, e.LastFire)
			}
			if v.Entries[1].LastResult != "kept" {
				t.Error("an entry without a live record changed")
			}
		})
	}
}

func samePtr(a, b *time.Time) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Equal(*b)
}

// TestLeaderOverlay: what `beatd status` takes from the leader's /status
// (LiveOf, OverlayRuns) is what the leader overlaid on its own.
func TestLeaderOverlay(t *testing.T) {
	next, errAt, pub := now.Add(-2*time.Second), now.Add(-time.Second), now.Add(-3*time.Second)
	leader := []Entry{{Name: "e", LastResult: "error", LastError: "down", LastErrorAt: &errAt, LastPublishedAt: &pub, NextRunAt: &next,
		Health: "behind", HealthReason: "r", TotalRunCount: 4, LastRunAt: &pub, RecentRuns: []outcome.Run{{PublishedAt: pub, Manual: true}}},
		{Name: "norun"}}
	mine := now.Add(time.Minute)
	v := View{Entries: []Entry{{Name: "e", NextRunAt: &mine, RecentRuns: []outcome.Run{}}, {Name: "norun", TotalRunCount: 9}}}
	v.Overlay(LiveOf(leader))
	v.OverlayRuns(leader)
	e := v.Entries[0]
	if e.LastResult != "error" || e.LastError != "down" || !samePtr(e.LastErrorAt, &errAt) || !samePtr(e.LastPublishedAt, &pub) ||
		!samePtr(e.NextRunAt, &next) || e.Health != "behind" || e.HealthReason != "r" {
		t.Errorf("results not taken from the leader: %+v", e)
	}
	if e.TotalRunCount != 4 || len(e.RecentRuns) != 1 || e.LastFire.Result != "published (manual)" {
		t.Errorf("runs not taken from the leader: %+v", e)
	}
	if v.Entries[1].TotalRunCount != 9 {
		t.Error("an entry the leader has no runs for lost its own")
	}
}

// TestWire: the view's JSON is /status's, field for field; what only
// renderers use stays off it.
func TestWire(t *testing.T) {
	b, err := json.Marshal(Entry{Name: "e", ScheduleWords: "every minute", LastFire: Fire{At: now, Result: "ok"}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"name":"e","task":"","schedule":"","enabled":false,"next_run_at":null,"last_slot":null,"last_run_at":null,"total_run_count":0,"paused":false,"recent_runs":null}`
	if string(b) != want {
		t.Errorf("JSON\n got %s\nwant %s", b, want)
	}
	if strings.Contains(string(b), "every minute") {
		t.Error("schedule words on the wire")
	}
}

// TestOutcomeOf: a published run finds its outcome by slot, a manual one
// by task id, and a skipped record is no run's.
func TestOutcomeOf(t *testing.T) {
	slot := now.Add(-time.Minute)
	e := Entry{Outcomes: Outcomes{Runs: []RunOutcome{
		{Slot: slot, Outcome: "skipped"},
		{Slot: slot, TaskID: "s", Outcome: "succeeded"},
		{Slot: slot, TaskID: "m", Manual: true, Outcome: "failed"},
	}}}
	tests := []struct {
		run  outcome.Run
		want string
	}{
		{outcome.Run{Slot: slot, TaskID: "s"}, "succeeded"},
		{outcome.Run{Slot: slot, TaskID: "m", Manual: true}, "failed"},
		{outcome.Run{Slot: slot, TaskID: "x", Manual: true}, ""},
		{outcome.Run{Slot: now, TaskID: "s"}, ""},
	}
	for _, tt := range tests {
		got := ""
		if o := e.OutcomeOf(tt.run); o != nil {
			got = o.Outcome
		}
		if got != tt.want {
			t.Errorf("OutcomeOf(%+v) = %q, want %q", tt.run, got, tt.want)
		}
	}
}
