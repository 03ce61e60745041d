package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// outcomeHarness is a harness whose scheduler tracks outcomes from a feed
// the test reports into, as the workers would.
type outcomeHarness struct {
	*harness
	feed *outcome.Feed
}

// newOutcomeHarness makes one on st and disp when given; with last, its
// dispatcher also says what it published last of each entry (as the
// Redis publisher's run records do).
func newOutcomeHarness(t *testing.T, yaml string, now time.Time, st *memStore, disp *fakeDispatcher, last ...map[string]outcome.Run) *outcomeHarness {
	t.Helper()
	h := newHarness(t, yaml, now)
	if st != nil {
		h.store = st
	}
	if disp != nil {
		h.disp = disp
	}
	var d Dispatcher = h.disp
	if len(last) > 0 {
		d = &lastDispatcher{fakeDispatcher: h.disp, last: last[0]}
	}
	feed := outcome.NewFeed(h.clock, 64)
	h.reg = prometheus.NewRegistry()
	s, err := New(Config{Dispatcher: d, Store: h.store, Clock: h.clock, Metrics: NewMetrics(h.reg), Cluster: "beatd/test",
		Origin: "beatd@test", Outcomes: feed}, mustConfig(t, yaml))
	if err != nil {
		t.Fatal(err)
	}
	h.sched = s
	return &outcomeHarness{harness: h, feed: feed}
}

// report says, as a worker would, that entry's run of slot reached kind,
// and waits until the loop applied it. exc is the exception's type and
// message; a lone "stale" marks a report the loop is expected to ignore
// (not waited for).
func (h *outcomeHarness) report(entry string, slot time.Time, kind outcome.Kind, exc ...string) {
	h.t.Helper()
	id := celery.SlotIDOf("beatd/test", entry, slot)
	ev := outcome.Event{TaskID: string(id[:]), Kind: kind, At: h.clock.Now(), Worker: "celery@w1", Runtime: 2 * time.Second}
	if len(exc) >= 2 {
		ev.ExcType, ev.ExcMessage = exc[0], exc[1]
	}
	before := h.runs(entry, kind)
	h.feed.Deliver(context.Background(), outcome.FromEvents, []outcome.Event{ev})
	if kind != outcome.Failed || len(exc) != 1 {
		eventually(h.t, 5*time.Second, fmt.Sprintf("%s of %s applied", kind, entry), func() bool { return h.runs(entry, kind) > before })
	}
	h.settle()
}

func (h *outcomeHarness) runs(entry string, k outcome.Kind) float64 {
	return h.sched.cfg.Metrics.Runs.value(entry, k.String())
}

// stop ends the term and waits for it, leaving its result for the
// harness's cleanup.
func (h *outcomeHarness) stop() {
	h.cancel()
	err := <-h.done
	h.done <- err
}

// at moves the clock to t0+d and lets the loop settle.
func (h *outcomeHarness) at(d time.Duration) {
	setClock(h.clock, t0.Add(d))
	h.settle()
}

func TestOverlapPolicies(t *testing.T) {
	s := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	ts := func(secs ...int) []string {
		out := make([]string, len(secs))
		for i, v := range secs {
			out[i] = "e " + s(v).UTC().Format(time.RFC3339)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		entry   string
		steps   func(h *outcomeHarness)
		want    []string
		skipped float64
		lost    float64
	}{
		{
			name:  "allow publishes over a running run",
			entry: "{task: t, every: 10s, relative: true}",
			steps: func(h *outcomeHarness) { h.at(10 * time.Second); h.at(20 * time.Second); h.at(30 * time.Second) },
			want:  ts(10, 20, 30),
		},
		{
			name:  "skip skips while the run is unfinished",
			entry: "{task: t, every: 10s, relative: true, overlap: skip}",
			steps: func(h *outcomeHarness) {
				h.at(10 * time.Second)
				h.report("e", s(10), outcome.Started)
				h.at(20 * time.Second) // started: skipped
				h.at(30 * time.Second) // still running: skipped
				h.report("e", s(10), outcome.Succeeded)
				h.at(40 * time.Second)
			},
			want:    ts(10, 40),
			skipped: 2,
		},
		{
			name:  "buffer_one holds one slot and publishes it when the run ends",
			entry: "{task: t, every: 10s, relative: true, overlap: buffer_one}",
			steps: func(h *outcomeHarness) {
				h.at(10 * time.Second)
				h.at(20 * time.Second) // held
				h.at(30 * time.Second) // skipped: one is held already
				h.clock.Advance(5 * time.Second)
				h.report("e", s(10), outcome.Failed, "ZeroDivisionError", "division by zero") // 20 goes out now
				h.at(40 * time.Second)                                                        // 20 is running: held
				h.report("e", s(20), outcome.Succeeded)                                       // 40 goes out
			},
			want:    ts(10, 20, 40),
			skipped: 1,
		},
		{
			name:  "an unfinished run stops blocking after overlap_timeout, as lost",
			entry: "{task: t, every: 10s, relative: true, overlap: skip, overlap_timeout: 15s}",
			steps: func(h *outcomeHarness) {
				h.at(10 * time.Second)
				h.clock.Advance(100 * time.Millisecond)
				h.report("e", s(10), outcome.Received)
				h.at(20 * time.Second) // 10s old: skipped
				h.at(30 * time.Second) // lost by the sweep at 25s; 30 publishes
			},
			want:    ts(10, 30),
			skipped: 1,
			lost:    1,
		},
		{
			name:  "with no report from any source the run is unreported, not lost",
			entry: "{task: t, every: 10s, relative: true, overlap: skip, overlap_timeout: 15s}",
			steps: func(h *outcomeHarness) {
				h.at(10 * time.Second)
				h.at(20 * time.Second) // skipped
				h.at(30 * time.Second) // unreported at 25s; 30 publishes
			},
			want:    ts(10, 30),
			skipped: 1,
		},
		{
			name:  "a report for an older run does not unblock the newest",
			entry: "{task: t, every: 10s, relative: true, overlap: skip}",
			steps: func(h *outcomeHarness) {
				h.at(10 * time.Second)
				h.report("e", s(10), outcome.Succeeded)
				h.at(20 * time.Second)
				h.report("e", s(10), outcome.Failed, "stale") // ignored: 10 already succeeded
				h.report("e", s(20), outcome.Started)         // (applied after it, in order)
				h.at(30 * time.Second)                        // 20 unfinished: skipped
			},
			want:    ts(10, 20),
			skipped: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newOutcomeHarness(t, "entries:\n  e: "+tc.entry+"\n", t0.Add(time.Second), nil, nil)
			h.start(7)
			h.settle()
			tc.steps(h)
			eventually(t, 5*time.Second, "the publishes", func() bool { return len(h.disp.list()) >= len(tc.want) })
			h.settle()
			if got := h.disp.list(); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("published\n%v\nwant\n%v", got, tc.want)
			}
			if got := h.runs("e", outcome.Skipped); got != tc.skipped {
				t.Errorf("skipped %v, want %v", got, tc.skipped)
			}
			if got := h.runs("e", outcome.Lost); got != tc.lost {
				t.Errorf("lost %v, want %v", got, tc.lost)
			}
		})
	}
}

// TestPauseAfterFailures: N failed runs in a row pause the entry, with
// the last exception as the reason; a success in between resets the count.
func TestPauseAfterFailures(t *testing.T) {
	h := newOutcomeHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true, pause_after_failures: 2}\n", t0.Add(time.Second), nil, nil)
	h.start(7)
	h.settle()
	step := func(sec int, k outcome.Kind) {
		h.at(time.Duration(sec) * time.Second)
		h.report("e", t0.Add(time.Duration(sec)*time.Second), k, "ZeroDivisionError", "division by zero")
	}
	step(10, outcome.Failed)
	step(20, outcome.Succeeded)
	step(30, outcome.Failed)
	step(40, outcome.Failed) // second in a row: paused
	h.at(50 * time.Second)
	h.at(60 * time.Second)
	if got := len(h.disp.list()); got != 4 {
		t.Errorf("published %d, want 4 (paused after the 40s run): %v", got, h.disp.list())
	}
	// The per-entry gauges say what the workers did (a leader's only).
	wantGauges := map[string]float64{
		"beatd_entry_consecutive_failures":                  2,
		"beatd_entry_last_worker_failure_timestamp_seconds": float64(t0.Add(40 * time.Second).Unix()),
		"beatd_entry_last_worker_success_timestamp_seconds": float64(t0.Add(20 * time.Second).Unix()),
	}
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if want, ok := wantGauges[mf.GetName()]; ok {
			if got := mf.GetMetric()[0].GetGauge().GetValue(); got != want {
				t.Errorf("%s = %v, want %v", mf.GetName(), got, want)
			}
			delete(wantGauges, mf.GetName())
		}
	}
	for name := range wantGauges {
		t.Errorf("%s not exported", name)
	}
	h.stop()
	st := h.store.get("e")
	if st == nil || !st.Paused || st.Out == nil {
		t.Fatalf("state %+v: not paused", st)
	}
	if st.Out.Failures != 2 || !strings.Contains(st.Out.PauseReason, "ZeroDivisionError: division by zero") {
		t.Errorf("failures %d, reason %q", st.Out.Failures, st.Out.PauseReason)
	}
	if got := testutil.ToFloat64(h.sched.cfg.Metrics.AutoPaused); got != 1 {
		t.Errorf("auto-paused counter %v", got)
	}
	if got := h.runs("e", outcome.Failed); got != 3 {
		t.Errorf("failed runs %v", got)
	}
}

// TestResumeAfterAutoPause: resuming an entry paused by
// pause_after_failures clears the reason and the count, so one more
// failure does not pause it again.
func TestResumeAfterAutoPause(t *testing.T) {
	h := newOutcomeHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true, pause_after_failures: 2}\n", t0.Add(time.Second), nil, nil)
	h.start(7)
	h.settle()
	for _, sec := range []int{10, 20} {
		h.at(time.Duration(sec) * time.Second)
		h.report("e", t0.Add(time.Duration(sec)*time.Second), outcome.Failed, "ValueError", "bad")
	}
	h.at(30 * time.Second) // paused: not published
	h.store.request(store.OpResume, "e")
	eventually(t, 5*time.Second, "the resume applied", func() bool { return len(h.store.pending()) == 0 })
	h.settle()
	h.at(40 * time.Second)
	h.report("e", t0.Add(40*time.Second), outcome.Failed, "ValueError", "bad")
	h.at(50 * time.Second) // one failure after the resume: still running
	// settle counts armed timers, not the loop's progress, and once let
	// the check run before the 50s fire (1 in ~100 runs under -race), so
	// the fire is waited for; a wrong pause times out here.
	h.waitPublished(4)
	if got := h.disp.list(); len(got) != 4 {
		t.Errorf("published %v: want 10, 20, 40, 50", got)
	}
	h.stop()
	if st := h.store.get("e"); st == nil || st.Paused || st.Out.PauseReason != "" || st.Out.Failures != 1 {
		t.Errorf("after resume and one failure: %+v %+v", st, st.Out)
	}
}

// TestOverlapSurvivesFailover: a run in progress when its leader stops is
// still in progress for the next leader, which keeps skipping until the
// run's outcome arrives.
func TestOverlapSurvivesFailover(t *testing.T) {
	yaml := "entries:\n  e: {task: t, every: 10s, relative: true, overlap: skip}\n"
	first := newOutcomeHarness(t, yaml, t0.Add(time.Second), nil, nil)
	first.start(7)
	first.settle()
	first.at(10 * time.Second)
	first.report("e", t0.Add(10*time.Second), outcome.Started)
	first.stop()

	st := newMemStore(8)
	st.states = first.store.states
	second := newOutcomeHarness(t, yaml, t0.Add(15*time.Second), st, first.disp)
	second.start(8)
	second.settle()
	second.at(20 * time.Second)
	second.at(30 * time.Second)
	if got := first.disp.list(); len(got) != 1 {
		t.Fatalf("the new leader published over the running run: %v", got)
	}
	if got := second.runs("e", outcome.Skipped); got != 2 {
		t.Errorf("skipped %v, want 2", got)
	}
	second.report("e", t0.Add(10*time.Second), outcome.Succeeded)
	second.at(40 * time.Second)
	if got := first.disp.list(); len(got) != 2 {
		t.Errorf("after the run ended: %v", got)
	}
}

// TestManualTriggerAndOverlap: a trigger publishes over an unfinished run
// unless it asks to respect the overlap policy; then it is skipped, and
// its request completed all the same.
func TestManualTriggerAndOverlap(t *testing.T) {
	h := newOutcomeHarness(t, "entries:\n  e: {task: t, every: 1h, overlap: skip}\n", t0.Add(time.Second), nil, nil)
	h.start(7)
	h.settle()
	h.store.request(store.OpTrigger, "e")
	eventually(t, 5*time.Second, "the first trigger", func() bool { return len(h.disp.list()) == 1 })
	h.settle()
	// The first trigger's run is unfinished: a trigger that respects the
	// policy is skipped, a plain one (below) is not.
	h.store.mu.Lock()
	h.store.requests = append(h.store.requests, store.Request{ID: "respect", Key: "respect", Op: store.OpTrigger, Entry: "e", RespectOverlap: true})
	h.store.mu.Unlock()
	h.store.watch <- struct{}{}
	eventually(t, 5*time.Second, "the respecting trigger handled", func() bool { return h.runs("e", outcome.Skipped) == 1 })
	h.settle()
	if got := h.disp.list(); len(got) != 1 {
		t.Errorf("published %v: the trigger that respects overlap went out over an unfinished run", got)
	}
	eventually(t, 5*time.Second, "the request completed", func() bool { return len(h.store.pending()) == 0 })
	h.store.request(store.OpTrigger, "e")
	eventually(t, 5*time.Second, "a plain trigger over the unfinished run", func() bool { return len(h.disp.list()) == 2 })
}

// lastDispatcher is a fakeDispatcher that also says what it published
// last of each entry, as the Redis publisher's run records do.
type lastDispatcher struct {
	*fakeDispatcher
	last map[string]outcome.Run
}

func (d *lastDispatcher) LastPublished(_ context.Context, entries []string) (map[string]outcome.Run, error) {
	out := map[string]outcome.Run{}
	for _, n := range entries {
		if r, ok := d.last[n]; ok {
			out[n] = r
		}
	}
	return out, nil
}

// TestOverlapAdoptsUnrecordedRun: the previous leader published a slot and
// died before writing its state; the new leader learns of the run from
// the broker and skips while it is unfinished.
func TestOverlapAdoptsUnrecordedRun(t *testing.T) {
	yaml := "entries:\n  e: {task: t, every: 10s, relative: true, overlap: skip}\n"
	st := newMemStore(8)
	st.states["e"] = &store.EntryState{Name: "e", Since: t0, LastSlot: t0} // written before the slot of 10s
	h := newOutcomeHarness(t, yaml, t0.Add(12*time.Second), st, nil,
		map[string]outcome.Run{"e": {Slot: t0.Add(10 * time.Second), PublishedAt: t0.Add(10 * time.Second)}})
	disp := h.disp
	h.start(8)
	h.settle()
	h.at(20 * time.Second)
	h.at(30 * time.Second)
	for _, p := range disp.list() {
		if p != "e 2026-11-30T10:00:10Z" { // the catch-up of 10s is a duplicate, not a new run
			t.Errorf("published %s over the run the broker knew of", p)
		}
	}
	if got := h.runs("e", outcome.Skipped); got != 2 {
		t.Errorf("skipped %v, want 2", got)
	}
	h.clock.Advance(100 * time.Millisecond)
	h.report("e", t0.Add(10*time.Second), outcome.Succeeded)
	h.at(40 * time.Second)
	if got := disp.list(); len(got) == 0 || got[len(got)-1] != "e 2026-11-30T10:00:40Z" {
		t.Errorf("after the adopted run ended: %v", got)
	}
}

// TestMaxRunsAndEndAt: max_runs stops an entry after N scheduled runs,
// across a failover in which the previous leader's last run was never
// written to etcd; end_at stops one at its end. Both then show as
// finished.
func TestMaxRunsAndEndAt(t *testing.T) {
	yaml := "entries:\n  n: {task: t, every: 10s, relative: true, max_runs: 3}\n" +
		"  until: {task: t, every: 10s, relative: true, end_at: '2026-11-30T10:00:25Z'}\n"
	h := newOutcomeHarness(t, yaml, t0.Add(time.Second), nil, nil)
	h.start(7)
	h.settle()
	h.at(10 * time.Second)
	h.at(20 * time.Second)
	h.stop()
	// The third run goes out from a leader that dies before its state
	// write: the broker knows of it, etcd does not.
	h.disp.seen["n 2026-11-30T10:00:30Z"] = true
	st := newMemStore(8)
	st.states = h.store.states
	// Started after 10:00:40 too: catch-up once would fire that slot, a
	// 4th run, unless the broker's 3rd is counted.
	second := newOutcomeHarness(t, yaml, t0.Add(45*time.Second), st, h.disp,
		map[string]outcome.Run{"n": {Slot: t0.Add(30 * time.Second), PublishedAt: t0.Add(30 * time.Second)}})
	disp := second.disp
	second.start(8)
	second.settle()
	second.at(50 * time.Second)
	second.at(60 * time.Second)
	var n, until []string
	for _, p := range disp.list() {
		if strings.HasPrefix(p, "n ") {
			n = append(n, p)
		} else {
			until = append(until, p)
		}
	}
	if want := slots("n", "2026-11-30T10:00:10Z", "2026-11-30T10:00:20Z"); strings.Join(n, ",") != strings.Join(want, ",") {
		t.Errorf("n published %v (plus the broker's 10:00:30): want %v and nothing after its 3rd run", n, want)
	}
	if want := slots("until", "2026-11-30T10:00:10Z", "2026-11-30T10:00:20Z"); strings.Join(until, ",") != strings.Join(want, ",") {
		t.Errorf("until published %v, want %v", until, want)
	}
	second.stop()
	cfg := mustConfig(t, yaml)
	for _, name := range []string{"n", "until"} {
		stored := st.get(name)
		if fin, _ := Finished(cfg.Entry(name), stored, t0.Add(time.Minute)); !fin {
			t.Errorf("%s not finished: %+v", name, stored)
		}
	}
	if _, left := Finished(cfg.Entry("n"), st.get("n"), t0.Add(time.Minute)); left != 0 {
		t.Errorf("n has %d runs left", left)
	}
}

// TestDecisiveStateWrittenAtOnce: with a state interval far longer than
// the test, what a next leader needs to act right is written at once:
// a first start's baselines, a reload's new entry's baseline, the end of
// a run that holds an overlap and an automatic pause. Progress alone
// waits for the interval (the broker's marks cover it), which shows the
// test tells the two apart.
func TestDecisiveStateWrittenAtOnce(t *testing.T) {
	const yaml = "entries:\n  e: {task: t, every: 10s, relative: true, pause_after_failures: 1}\n  f: {task: t, every: 10s, relative: true}\n" +
		"  o: {task: t, every: 10s, relative: true, overlap: skip}\n"
	h := newOutcomeHarness(t, yaml, t0.Add(time.Second), nil, nil)
	s, err := New(Config{Dispatcher: h.disp, Store: h.store, Clock: h.clock, Metrics: NewMetrics(prometheus.NewRegistry()), Cluster: "beatd/test",
		Origin: "beatd@test", Outcomes: h.feed, StateInterval: time.Hour}, mustConfig(t, yaml))
	if err != nil {
		t.Fatal(err)
	}
	h.sched = s
	h.start(7)
	h.settle()
	baseline := func(name string) func() bool {
		return func() bool { st := h.store.get(name); return st != nil && !st.Since.IsZero() }
	}
	eventually(t, 5*time.Second, "the first start's baselines in the store", func() bool { return baseline("e")() && baseline("f")() })

	if err := h.sched.Reload(mustConfig(t, yaml+"  g: {task: t, every: 10s, relative: true}\n")); err != nil {
		t.Fatal(err)
	}
	h.settle()
	eventually(t, 5*time.Second, "the new entry's baseline in the store", baseline("g"))

	h.at(10 * time.Second)
	h.waitPublished(3)
	h.settle()
	if st := h.store.get("f"); st == nil || !st.LastSlot.IsZero() {
		t.Errorf("f's progress written before the interval: %+v", st)
	}
	// The end of a run that frees an overlap: skip entry.
	h.report("o", t0.Add(10*time.Second), outcome.Succeeded)
	eventually(t, 5*time.Second, "o's finished run in the store", func() bool {
		st := h.store.get("o")
		return st != nil && st.Out != nil && st.Out.Newest() != nil && st.Out.Newest().Kind == outcome.Succeeded
	})
	h.report("e", t0.Add(10*time.Second), outcome.Failed, "ValueError", "boom")
	eventually(t, 5*time.Second, "the automatic pause in the store", func() bool { st := h.store.get("e"); return st != nil && st.Paused })
}
