package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// series returns the value of the series name{labels} in reg, and whether
// it exists.
func series(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

func count(t *testing.T, reg prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// TestMetricsStartAtZero: every labelled series exists from the start, so
// rate() and absent() alerts work before the first event.
func TestMetricsStartAtZero(t *testing.T) {
	h := newHarness(t, "entries:\n  a: {task: t, every: 10s, relative: true}\n  b: {task: t, every: 1m, relative: true}\n", t0)
	for _, e := range []string{"a", "b"} {
		for _, r := range []string{"ok", "duplicate", "stale", "error", "manual"} {
			if v, ok := series(t, h.reg, "beatd_fires_total", map[string]string{"entry": e, "result": r}); !ok || v != 0 {
				t.Errorf("beatd_fires_total{entry=%q,result=%q} = %v, %v; want 0, present", e, r, v, ok)
			}
		}
		for _, r := range missedReasons {
			if _, ok := series(t, h.reg, "beatd_missed_slots_total", map[string]string{"entry": e, "reason": r}); !ok {
				t.Errorf("beatd_missed_slots_total{entry=%q,reason=%q} missing", e, r)
			}
		}
		if v, ok := series(t, h.reg, "beatd_entry_last_success_timestamp_seconds", map[string]string{"entry": e}); !ok || v != 0 {
			t.Errorf("last success of %s = %v, %v", e, v, ok)
		}
	}
	if v, ok := series(t, h.reg, "beatd_pending_slots", nil); !ok || v != 0 {
		t.Errorf("beatd_pending_slots = %v, %v", v, ok)
	}
	// A standby exports no next fire times: it does not schedule.
	if _, ok := series(t, h.reg, "beatd_oldest_next_fire_timestamp_seconds", nil); ok {
		t.Error("next fire exported before leading")
	}
}

// TestMetricsTimestamps: next fire, last success, manual triggers and a
// broker outage as the leader's metrics show them.
func TestMetricsTimestamps(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	h.start(7)
	h.settle()
	next := func() float64 {
		v, _ := series(t, h.reg, "beatd_entry_next_fire_timestamp_seconds", map[string]string{"entry": "e"})
		return v
	}
	oldest := func() float64 {
		v, _ := series(t, h.reg, "beatd_oldest_next_fire_timestamp_seconds", nil)
		return v
	}
	if want := float64(t0.Add(10 * time.Second).Unix()); next() != want || oldest() != want {
		t.Fatalf("next fire %v, oldest %v; want %v", next(), oldest(), want)
	}
	h.clock.Advance(10 * time.Second)
	h.waitPublished(1)
	h.settle()
	if want := float64(t0.Add(20 * time.Second).Unix()); next() != want {
		t.Errorf("next fire after a fire %v, want %v", next(), want)
	}
	if v, _ := series(t, h.reg, "beatd_entry_last_success_timestamp_seconds", map[string]string{"entry": "e"}); v != float64(t0.Add(11*time.Second).Unix()) {
		t.Errorf("last success %v, want the publish time %v", v, t0.Add(11*time.Second).Unix())
	}

	h.store.request(store.OpTrigger, "e")
	h.waitPublished(2)
	if v := h.sched.cfg.Metrics.Fires.value("e", "manual"); v != 1 {
		t.Errorf("manual fires %v, want 1", v)
	}
	if v := h.sched.cfg.Metrics.Fires.value("e", "ok"); v != 1 {
		t.Errorf("ok fires %v, want 1 (the trigger counts as manual)", v)
	}
	if r := h.sched.cfg.Metrics.Results()["e"]; r.LastResult != "manual" {
		t.Errorf("last result %+v", r)
	}

	// The broker fails: the slot due at 20s stays pending and overdue.
	h.disp.setErr(errors.New("connection refused"))
	h.clock.Advance(10 * time.Second)
	eventually(t, 5*time.Second, "a pending slot", func() bool { return testutil.ToFloat64(h.sched.cfg.Metrics.PendingSlots) > 0 })
	for i := 0; i < 3; i++ {
		h.clock.Advance(10 * time.Second)
		h.settle() // the loop retried and re-armed its timer
	}
	if v := testutil.ToFloat64(h.sched.cfg.Metrics.PendingSlots); v < 1 {
		t.Errorf("beatd_pending_slots = %v during the outage", v)
	}
	if want := float64(t0.Add(20 * time.Second).Unix()); next() != want || oldest() != want {
		t.Errorf("during the outage next fire %v, oldest %v; want the stuck slot %v", next(), oldest(), want)
	}
	if v := h.sched.cfg.Metrics.Fires.value("e", "error"); v < 1 {
		t.Errorf("error fires %v", v)
	}
	if r := h.sched.cfg.Metrics.Results()["e"]; r.LastResult != "error" || r.LastError != "connection refused" {
		t.Errorf("last result during the outage %+v", r)
	}
	h.disp.setErr(nil)
	h.clock.Advance(5 * time.Second)
	h.waitPublished(6)
	h.settle()
	if next() < float64(h.clock.Now().Unix()) {
		t.Errorf("next fire %v still in the past after recovery (now %v)", next(), h.clock.Now().Unix())
	}
}

// limitHarness starts a leader on yaml with a per-entry limit.
func limitHarness(t *testing.T, limit int, yaml string) (*harness, *Scheduler, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.PerEntryLimit = limit
	h := &harness{t: t, clock: clockwork.NewFakeClockAt(t0), disp: newFakeDispatcher(), store: newMemStore(7), reg: reg}
	s, err := New(Config{Dispatcher: h.disp, Store: h.store, Clock: h.clock, Metrics: m, Cluster: "beatd/test"}, mustConfig(t, yaml))
	if err != nil {
		t.Fatal(err)
	}
	h.sched = s
	h.start(7)
	h.settle()
	return h, s, reg
}

// TestMetricsPerEntryLimit: past the limit, no per-entry series; the
// aggregates stay.
func TestMetricsPerEntryLimit(t *testing.T) {
	h, s, reg := limitHarness(t, 2, "entries:\n  a: {task: t, every: 10s}\n  b: {task: t, every: 10s}\n  c: {task: t, every: 10s, relative: true}\n")
	h.clock.Advance(10 * time.Second)
	h.waitPublished(3)
	h.settle()
	if v, ok := series(t, reg, "beatd_fires_total", map[string]string{"entry": "", "result": "ok"}); !ok || v != 3 {
		t.Errorf("aggregate ok fires = %v, %v; want 3", v, ok)
	}
	if n := count(t, reg, "beatd_fires_total"); n != len(fireResults) {
		t.Errorf("%d fires_total series past the limit, want one per result", n)
	}
	for _, name := range []string{"beatd_entry_next_fire_timestamp_seconds", "beatd_entry_last_success_timestamp_seconds"} {
		if n := count(t, reg, name); n != 0 {
			t.Errorf("%d %s series past the limit", n, name)
		}
	}
	if v, ok := series(t, reg, "beatd_oldest_next_fire_timestamp_seconds", nil); !ok || v != float64(t0.Add(20*time.Second).Unix()) {
		t.Errorf("oldest next fire = %v, %v", v, ok)
	}
	if v, _ := series(t, reg, "beatd_per_entry_metrics", nil); v != 0 {
		t.Errorf("beatd_per_entry_metrics = %v", v)
	}
	// Back under the limit: per-entry series again, the aggregate gone.
	if err := s.Reload(mustConfig(t, "entries:\n  a: {task: t, every: 10s, relative: true}\n")); err != nil {
		t.Fatal(err)
	}
	if _, ok := series(t, reg, "beatd_fires_total", map[string]string{"entry": "", "result": "ok"}); ok {
		t.Error("aggregate series kept after going under the limit")
	}
	if _, ok := series(t, reg, "beatd_fires_total", map[string]string{"entry": "a", "result": "error"}); !ok {
		t.Error("per-entry series not created under the limit")
	}
}

// fenceDown is a dispatcher whose broker refuses the fence: the term
// cannot start.
type fenceDown struct{ *fakeDispatcher }

func (fenceDown) RaiseFence(context.Context, int64) error { return errors.New("connection refused") }

// TestOverdueWhileTheTermCannotStart: a leader stuck raising the fence
// still exports its earliest slot, which then becomes overdue.
func TestOverdueWhileTheTermCannotStart(t *testing.T) {
	h := newHarness(t, "entries:\n  fast: {task: t, every: 10s, relative: true}\n  slow: {task: t, every: 1h, relative: true}\n  off: {task: t, every: 1s, enabled: false}\n", t0.Add(time.Second))
	h.sched.cfg.Dispatcher = fenceDown{h.disp}
	h.start(7)
	eventually(t, 5*time.Second, "the oldest next fire to be the fast entry's first slot", func() bool {
		v, ok := series(t, h.reg, "beatd_oldest_next_fire_timestamp_seconds", nil)
		return ok && v == float64(t0.Add(10*time.Second).Unix())
	})
	// What readiness reports first: the leader cannot publish.
	eventually(t, 5*time.Second, "the fence's error as the publish error", func() bool {
		err := h.sched.PublishError()
		return err != nil && strings.Contains(err.Error(), "raise the fence: connection refused")
	})
	h.cancel()
	<-h.done
	h.done <- nil
	if _, ok := series(t, h.reg, "beatd_oldest_next_fire_timestamp_seconds", nil); ok {
		t.Error("next fire still exported after the term")
	}
}

// TestEntryCounterVec: an entry's alerted series are exported at 0 from
// its creation, the others from their first count, and the text format
// holds across scrapes (the label pairs are cached at the first).
func TestEntryCounterVec(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	m.stats.perEntry.Store(true) // as setEntries does under the limit
	m.createSeries("a")
	runs := func(entry, kind string) (float64, bool) {
		return series(t, reg, "beatd_runs_total", map[string]string{"entry": entry, "outcome": kind})
	}
	for _, tc := range []struct {
		kind    string
		present bool
	}{{"succeeded", true}, {"failed", true}, {"lost", true}, {"skipped", true}, {"published", false}, {"started", false}} {
		if v, ok := runs("a", tc.kind); ok != tc.present || v != 0 {
			t.Errorf("runs{a,%s} before a count = %v, present %v; want 0, present %v", tc.kind, v, ok, tc.present)
		}
	}
	m.Runs.WithLabelValues("a", "published").Add(2)
	m.Runs.WithLabelValues("b", "succeeded").Inc() // an entry first named by a count
	for _, tc := range []struct {
		entry, kind string
		want        float64
	}{{"a", "published", 2}, {"a", "succeeded", 0}, {"b", "succeeded", 1}, {"b", "failed", 0}} {
		if v, ok := runs(tc.entry, tc.kind); !ok || v != tc.want {
			t.Errorf("runs{%s,%s} = %v, present %v; want %v", tc.entry, tc.kind, v, ok, tc.want)
		}
	}
	want := `
# HELP beatd_missed_slots_total ` + missedHelp(t, reg) + `
# TYPE beatd_missed_slots_total counter
beatd_missed_slots_total{entry="a",reason="catchup_once"} 0
beatd_missed_slots_total{entry="a",reason="catchup_skip"} 0
beatd_missed_slots_total{entry="a",reason="catchup_window"} 3
beatd_missed_slots_total{entry="a",reason="max_catchup"} 0
beatd_missed_slots_total{entry="a",reason="max_runs"} 0
beatd_missed_slots_total{entry="a",reason="overlap"} 0
beatd_missed_slots_total{entry="a",reason="paused"} 0
beatd_missed_slots_total{entry="a",reason="removed"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "beatd_missed_slots_total"); err == nil {
		t.Error("compared equal before the count")
	}
	m.Missed.WithLabelValues("a", ReasonWindow).Add(3)
	for range 2 { // the second scrape reuses the first's label pairs
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "beatd_missed_slots_total"); err != nil {
			t.Fatal(err)
		}
	}
}

func missedHelp(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "beatd_missed_slots_total" {
			return mf.GetHelp()
		}
	}
	t.Fatal("beatd_missed_slots_total not exported")
	return ""
}

// TestEntryCounterVecConcurrent: counts and new entries while scrapes run
// (for -race), and no count is lost.
func TestEntryCounterVecConcurrent(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.stats.perEntry.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			m.Fires.WithLabelValues(fmt.Sprintf("e%d", i%50), "ok").Inc()
		}
	}()
	for scraping := true; scraping; {
		select {
		case <-done:
			scraping = false
		default:
			if _, err := reg.Gather(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 50 {
		if v, ok := series(t, reg, "beatd_fires_total", map[string]string{"entry": fmt.Sprintf("e%d", i), "result": "ok"}); !ok || v != 40 {
			t.Fatalf("fires{e%d,ok} = %v, present %v; want 40", i, v, ok)
		}
	}
}

// TestMetricsPerEntryLimitCrossed: entries that fired before the config
// grew past the limit, by a delta reload, count into the aggregate after it, not into the
// per-entry series the switch dropped.
func TestMetricsPerEntryLimitCrossed(t *testing.T) {
	h, s, reg := limitHarness(t, 2, "entries:\n  a: {task: t, every: 10s}\n  b: {task: t, every: 10s}\n")
	h.clock.Advance(10 * time.Second)
	h.waitPublished(2)
	h.settle()
	if v, ok := series(t, reg, "beatd_fires_total", map[string]string{"entry": "a", "result": "ok"}); !ok || v != 1 {
		t.Fatalf("fires{a,ok} under the limit = %v, %v; want 1", v, ok)
	}
	// A delta reload (the entries API, an etcd source) keeps a and b's
	// entries, and with them their cached counters.
	if err := s.ReloadDelta(mustConfig(t, "entries:\n  a: {task: t, every: 10s}\n  b: {task: t, every: 10s}\n  c: {task: t, every: 10s}\n"), []string{"c"}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	h.clock.Advance(10 * time.Second)
	h.waitPublished(5)
	h.settle()
	if v, ok := series(t, reg, "beatd_fires_total", map[string]string{"entry": "", "result": "ok"}); !ok || v != 3 {
		t.Errorf("aggregate ok fires after crossing the limit = %v, %v; want 3 (a, b and c once each)", v, ok)
	}
}
