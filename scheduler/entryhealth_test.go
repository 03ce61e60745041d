package scheduler

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
)

// stuckSchedule gives the same slot for ever: a schedule whose arithmetic
// went wrong (an overflow that wrapped), as `every: 2400000h` once did.
type stuckSchedule struct{ at time.Time }

func (s stuckSchedule) Next(time.Time) time.Time { return s.at }

// withSchedule replaces entry name's schedule in cfg, for schedules the
// validator refuses.
func withSchedule(t *testing.T, cfg *config.Config, name string, s schedule.Schedule) *config.Config {
	t.Helper()
	e := cfg.Entry(name)
	if e == nil {
		t.Fatalf("no entry %q", name)
	}
	e.Schedule = s
	return cfg
}

func newHarnessWith(t *testing.T, yaml string, now time.Time, edit func(*config.Config)) *harness {
	t.Helper()
	h := newHarness(t, yaml, now)
	cfg := mustConfig(t, yaml)
	edit(cfg)
	if err := h.sched.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	return h
}

func countPrefix(list []string, prefix string) int {
	n := 0
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// An entry whose slots are always due (1 ns, which only --min-interval
// admits, and not that low) gets its share of each pass: the others fire
// on their slots, and a DELETE, a pause and the end of the term are served
// while it spins.
func TestAlwaysDueEntryLeavesTheLoopToOthers(t *testing.T) {
	const yaml = "entries:\n  fast: {task: t, every: 1s}\n  other: {task: t, every: 1s, relative: true}\n  third: {task: t, every: 1s, relative: true}\n"
	h := newHarnessWith(t, yaml, t0, func(cfg *config.Config) {
		ev, err := schedule.NewEvery(time.Nanosecond, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		withSchedule(t, cfg, "fast", ev)
	})
	h.start(7)
	h.settle()
	h.clock.Advance(time.Second) // a billion of fast's slots come due
	eventually(t, 5*time.Second, "other's and third's slots", func() bool {
		got := h.disp.list()
		return countPrefix(got, "other ") == 1 && countPrefix(got, "third ") == 1
	})
	eventually(t, 5*time.Second, "fast flagged behind", func() bool {
		return h.sched.cfg.Metrics.Results()["fast"].Health == HealthBehind
	})
	if err := h.sched.Health(h.clock.Now()); err == nil || !strings.Contains(err.Error(), "fast") {
		t.Errorf("Health = %v, want it to name fast as behind", err)
	}
	if got := gaugeOf(t, h, "beatd_entries_behind"); got != 1 {
		t.Errorf("beatd_entries_behind = %v, want 1", got)
	}

	// A pause of another entry is applied while fast still spins.
	h.store.request(store.OpPause, "third")
	start := time.Now()
	eventually(t, 2*time.Second, "the pause", func() bool { st := h.store.get("third"); return st != nil && st.Paused })
	if took := time.Since(start); took > time.Second {
		t.Errorf("pause applied after %s, want ≤ 1s", took)
	} else {
		t.Logf("pause applied %s after its request, while fast spun", took)
	}

	// The DELETE of fast is applied within a second, and it fires no more.
	start = time.Now()
	if err := h.sched.Reload(mustConfig(t, "entries:\n  other: {task: t, every: 1s, relative: true}\n  third: {task: t, every: 1s, relative: true}\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the delete applied", func() bool { return h.sched.applied.Load() == h.sched.entries.Load() })
	if took := time.Since(start); took > time.Second {
		t.Errorf("delete applied after %s, want ≤ 1s", took)
	} else {
		t.Logf("delete applied %s after the reload, while fast spun", took)
	}
	h.settle() // idle again: nothing of fast is due or pending
	n := countPrefix(h.disp.list(), "fast ")
	h.clock.Advance(time.Second)
	h.settle()
	if got := countPrefix(h.disp.list(), "fast "); got != n {
		t.Errorf("fast published %d more after its delete", got-n)
	}
	if got := countPrefix(h.disp.list(), "other "); got != 2 {
		t.Errorf("other published %d slots after 2 s, want 2", got)
	}
	if r := h.sched.cfg.Metrics.Results()["fast"]; r.Health != "" {
		t.Errorf("fast still flagged %q after its delete", r.Health)
	}
	if err := h.sched.Health(h.clock.Now()); err != nil {
		t.Errorf("Health after the delete = %v", err)
	}
}

// A schedule that stops moving forward is stopped and reported, not spun;
// a new definition starts the entry again.
func TestRunawayEntryIsStopped(t *testing.T) {
	const yaml = "entries:\n  stuck: {task: t, every: 1s}\n  wrapped: {task: t, every: 1s}\n  other: {task: t, every: 1s, relative: true}\n"
	h := newHarnessWith(t, yaml, t0, func(cfg *config.Config) {
		withSchedule(t, cfg, "stuck", stuckSchedule{at: t0.Add(time.Second)})
		// An overflow that wrapped into the past, as a slot dated 1716.
		withSchedule(t, cfg, "wrapped", stuckSchedule{at: time.Date(1716, 1, 1, 0, 0, 0, 0, time.UTC)})
	})
	h.start(7)
	h.settle()
	h.clock.Advance(time.Second)
	h.settle()
	h.clock.Advance(time.Second)
	h.settle()
	got := h.disp.list()
	if n := countPrefix(got, "stuck "); n != 1 {
		t.Errorf("stuck published %d times, want its one slot before the loop saw it repeat: %v", n, got)
	}
	if n := countPrefix(got, "wrapped "); n != 0 {
		t.Errorf("wrapped published %d times, want 0: %v", n, got)
	}
	if n := countPrefix(got, "other "); n != 2 {
		t.Errorf("other published %d slots in 2 s, want 2: %v", n, got)
	}
	res := h.sched.cfg.Metrics.Results()
	for _, name := range []string{"stuck", "wrapped"} {
		if res[name].Health != HealthRunaway {
			t.Errorf("%s health = %q, want runaway", name, res[name].Health)
		}
	}
	err := h.sched.Health(h.clock.Now())
	if err == nil || !strings.Contains(err.Error(), "stuck, wrapped") {
		t.Errorf("Health = %v, want it to name stuck and wrapped", err)
	}
	if got := gaugeOf(t, h, "beatd_entries_runaway"); got != 2 {
		t.Errorf("beatd_entries_runaway = %v, want 2", got)
	}

	// A sane definition of both starts them afresh.
	if err := h.sched.Reload(mustConfig(t, yaml)); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if err := h.sched.Health(h.clock.Now()); err != nil {
		t.Errorf("Health after a sane reload = %v", err)
	}
	h.clock.Advance(time.Second)
	h.settle()
	if n := countPrefix(h.disp.list(), "wrapped "); n != 1 {
		t.Errorf("wrapped published %d slots after its fix, want 1", n)
	}
}

// gaugeOf gathers one unlabelled gauge or counter from the harness's registry.
func gaugeOf(t *testing.T, h *harness, name string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			if c := mf.GetMetric()[0].GetCounter(); c != nil {
				return c.GetValue()
			}
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// An outage counts each slot once, at its first failed publish, and the
// retries apart; a slot an earlier term pushed is published, not a
// duplicate.
func TestFiresCountSlotsNotAttempts(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 1s, relative: true}\n  d: {task: t, every: 1s, relative: true}\n", t0)
	// An earlier term pushed d's first slot and died before recording it.
	h.disp.seen["d 2026-11-30T10:00:01Z"] = true
	h.start(7)
	h.settle()
	h.clock.Advance(time.Second)
	eventually(t, 5*time.Second, "the first slots", func() bool { return len(h.disp.list()) >= 1 })
	h.settle()
	m := h.sched.cfg.Metrics
	if v := m.Fires.value("d", "ok"); v != 1 {
		t.Errorf("d's deduplicated slot counted ok %v times, want 1", v)
	}
	if v := m.Fires.value("d", "duplicate"); v != 0 {
		t.Errorf("d counted duplicate %v times, want 0", v)
	}
	if v := gaugeOf(t, h, "beatd_fires_deduplicated_total"); v != 1 {
		t.Errorf("beatd_fires_deduplicated_total = %v, want 1", v)
	}
	if r := m.Results()["d"]; r.LastResult != "ok" {
		t.Errorf("d's last result = %q, want ok", r.LastResult)
	}

	// An outage of 15 s (15 slots), each slot retried many times.
	h.disp.setErr(errors.New("connection refused"))
	for i := 0; i < 5; i++ {
		h.clock.Advance(time.Second)
		for j := 0; j < 4; j++ { // backoff timers fire: more attempts
			h.settle()
			h.clock.Advance(500 * time.Millisecond)
		}
	}
	h.settle()
	failed := m.Fires.value("e", "error")
	if failed < 1 || failed > 15 {
		t.Errorf("e's failed slots = %v over an outage of 15 slots, want each slot once", failed)
	}
	if v := gaugeOf(t, h, "beatd_publish_retries_total"); v < failed {
		t.Errorf("beatd_publish_retries_total = %v, want the retries counted apart (≥ %v)", v, failed)
	}
	h.disp.setErr(nil)
	h.clock.Advance(3 * time.Second)
	h.settle()
	if got := m.Fires.value("e", "error"); got != failed {
		t.Errorf("e's failed slots moved from %v to %v after the outage", failed, got)
	}
	if r := m.Results()["e"]; r.LastResult != "ok" {
		t.Errorf("e's last result after the outage = %q, want ok", r.LastResult)
	}
}

// A broker outage makes pending slots late; those over 30 s late go
// through the entry's catch-up policy, as late slots found in the heap do.
func TestOutageLateSlotsFollowCatchup(t *testing.T) {
	tests := []struct {
		name    string
		catchup string
		missed  string
		// minMissed: of the outage's 41 slots, at least the first ten are
		// over 30 s late when the broker answers again; the policy drops
		// all of them but the latest (once), or all (skip).
		minMissed float64
	}{
		{name: "all", catchup: "all"},
		{name: "once", catchup: "once", missed: ReasonOnce, minMissed: 10},
		{name: "skip", catchup: "skip", missed: ReasonSkip, minMissed: 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, "entries:\n  e: {task: t, every: 1s, relative: true, catchup: "+tt.catchup+"}\n", t0)
			h.start(7)
			h.settle()
			h.disp.setErr(errors.New("connection refused"))
			for i := 0; i < 41; i++ {
				h.clock.Advance(time.Second)
				h.settle()
			}
			h.disp.setErr(nil)
			h.clock.Advance(2500 * time.Millisecond) // past any backoff: slots up to 10:00:43
			h.settle()
			const total = 43
			got := countPrefix(h.disp.list(), "e ")
			var missed float64
			if tt.missed != "" {
				missed = h.sched.cfg.Metrics.Missed.value("e", tt.missed)
			}
			if float64(got)+missed != total || missed < tt.minMissed {
				t.Fatalf("published %d and missed{%s} %v of %d slots, want every slot accounted for and ≥ %v dropped: %v",
					got, tt.missed, missed, total, tt.minMissed, h.disp.list())
			}
			if tt.catchup == "once" || tt.catchup == "skip" {
				// The dropped slots are the oldest: once keeps the latest
				// late one, and every slot after it goes out.
				first, _ := time.Parse(time.RFC3339, strings.TrimPrefix(h.disp.list()[0], "e "))
				if want := t0.Add(time.Duration(missed+1) * time.Second); !first.Equal(want) {
					t.Errorf("first slot published %s, want %s", first.Format(time.RFC3339), want.Format(time.RFC3339))
				}
			}
		})
	}
}
