package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/outcome"
)

// The chained entry of these tests, and a probe (overlap: its runs are
// recorded) whose one run (slot 10s) orders the tests' reports: the loop
// applies reports in the order they are delivered, so once a probe
// report is counted, every report before it was applied, including
// chain steps', which count nothing.
const chainYAML = `entries:
  e: {task: t1, every: 10s, relative: true, %s, chain: [{task: t2}, {task: t3}]}
  probe: {task: p, every: 10s, relative: true, max_runs: 1, overlap: skip}
`

// reportStep delivers, as a worker would, reports about steps of entry's
// run of slot (0: its task), without waiting.
func (h *outcomeHarness) reportStep(entry string, slot time.Time, steps ...outcome.Event) {
	h.t.Helper()
	head := celery.SlotIDOf("beatd/test", entry, slot)
	evs := make([]outcome.Event, len(steps))
	for i, ev := range steps {
		n := int(ev.Runtime) // the step, in the test's shorthand
		id := head
		if n > 0 {
			id = celery.StepID(head, n)
		}
		ev.TaskID, ev.Runtime, ev.At, ev.Worker = string(id[:]), 0, h.clock.Now(), "celery@w1"
		evs[i] = ev
	}
	h.feed.Deliver(context.Background(), outcome.FromEvents, evs)
}

// step is a report about step n reaching k, for reportStep.
func step(n int, k outcome.Kind) outcome.Event {
	ev := outcome.Event{Kind: k, Runtime: time.Duration(n)}
	if k == outcome.Failed {
		ev.ExcType, ev.ExcMessage = "ValueError", fmt.Sprintf("step %d failed", n)
	}
	return ev
}

// applied waits until every report delivered so far was applied.
func (h *outcomeHarness) applied() {
	h.t.Helper()
	k := outcome.Received
	if h.runs("probe", outcome.Received) > h.runs("probe", outcome.Retried) {
		k = outcome.Retried // received and retried take turns: each moves the run
	}
	h.report("probe", t0.Add(10*time.Second), k)
}

// fires lists entry's published slots as seconds after t0.
func (h *outcomeHarness) fires(entry string) []int {
	var out []int
	for _, f := range h.disp.list() {
		name, slot, _ := strings.Cut(f, " ")
		if name != entry {
			continue
		}
		at, err := time.Parse(time.RFC3339, slot)
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, int(at.Sub(t0)/time.Second))
	}
	return out
}

// watched counts the task ids the feed watches for entry's runs: each
// run's task and its chain's steps, none once it ended.
func (h *outcomeHarness) watched(entry string) int {
	n := 0
	for _, id := range h.feed.WatchedSince(h.clock.Now().Add(time.Hour), nil) {
		for _, sec := range h.fires(entry) {
			head := celery.SlotIDOf("beatd/test", entry, t0.Add(time.Duration(sec)*time.Second))
			for s := 0; s <= celery.MaxChainSteps; s++ {
				sid := head
				if s > 0 {
					sid = celery.StepID(head, s)
				}
				if id == string(sid[:]) {
					n++
				}
			}
		}
	}
	return n
}

// TestChainedRunHoldsOverlap: overlap: skip holds the next slot while
// any step of the chain runs, not only its first task, and frees it when
// the last step succeeds; the run counts as one success.
func TestChainedRunHoldsOverlap(t *testing.T) {
	s := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	h := newOutcomeHarness(t, fmt.Sprintf(chainYAML, "overlap: skip"), t0.Add(time.Second), nil, nil)
	h.start(7)
	h.settle()
	h.at(10 * time.Second)
	h.waitPublished(2)
	if got := h.watched("e"); got != 3 {
		t.Errorf("watching %d ids of the run, want its task and 2 steps", got)
	}
	h.report("e", s(10), outcome.Started)
	h.reportStep("e", s(10), step(0, outcome.Succeeded), step(1, outcome.Started), step(1, outcome.Succeeded), step(2, outcome.Started))
	h.applied()
	h.at(20 * time.Second) // the last step runs: skipped
	if got := h.runs("e", outcome.Skipped); got != 1 {
		t.Fatalf("skipped %v while step 3 ran, want 1; published %v", got, h.fires("e"))
	}
	h.reportStep("e", s(10), step(2, outcome.Succeeded))
	eventually(t, 5*time.Second, "the chain's success", func() bool { return h.runs("e", outcome.Succeeded) == 1 })
	h.settle()
	if got := h.watched("e"); got != 0 {
		t.Errorf("still watching %d ids of the ended run", got)
	}
	h.at(30 * time.Second)
	eventually(t, 5*time.Second, "the slot after the chain", func() bool { return len(h.fires("e")) == 2 })
	if got := h.fires("e"); !slices.Equal(got, []int{10, 30}) {
		t.Errorf("published %v, want [10 30]", got)
	}
	if got := h.runs("e", outcome.Started); got != 1 {
		t.Errorf("started runs %v, want 1: a step's start is not a run's", got)
	}
}

// TestChainedRunFailsAtItsStep: a step that fails fails the run, at that
// step, with its exception; pause_after_failures counts it, and its
// reason names the step.
func TestChainedRunFailsAtItsStep(t *testing.T) {
	s := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	h := newOutcomeHarness(t, fmt.Sprintf(chainYAML, "pause_after_failures: 2"), t0.Add(time.Second), nil, nil)
	h.start(7)
	h.settle()
	h.at(10 * time.Second)
	h.reportStep("e", s(10), step(0, outcome.Succeeded), step(1, outcome.Failed))
	eventually(t, 5*time.Second, "the run failed", func() bool { return h.runs("e", outcome.Failed) == 1 })
	h.at(20 * time.Second)
	// The task and step 2 succeed, step 3 fails; the result backend's
	// mark of no later step matters: there is none.
	h.reportStep("e", s(20), step(0, outcome.Succeeded), step(1, outcome.Succeeded), step(2, outcome.Failed))
	eventually(t, 5*time.Second, "the second run failed", func() bool { return h.runs("e", outcome.Failed) == 2 })
	h.at(30 * time.Second) // paused
	h.applied()
	if got := h.fires("e"); !slices.Equal(got, []int{10, 20}) {
		t.Errorf("published %v, want [10 20]: paused after two failed chains", got)
	}
	if got := h.runs("e", outcome.Succeeded); got != 0 {
		t.Errorf("succeeded runs %v: a step's success is not the run's", got)
	}
	h.stop()
	st := h.store.get("e")
	if st == nil || !st.Paused || st.Out == nil || len(st.Out.Runs) < 2 {
		t.Fatalf("state %+v: not paused with two runs", st)
	}
	for i, want := range []struct {
		step uint8
		msg  string
	}{{2, "step 2 failed"}, {1, "step 1 failed"}} {
		r := st.Out.Runs[i]
		if r.Kind != outcome.Failed || r.Chain != 2 || r.Step != want.step || r.ExcMsg != want.msg {
			t.Errorf("run %d: %v at step %d/%d (%s), want failed at step %d (%s)", i, r.Kind, r.Step, r.Chain, r.ExcMsg, want.step, want.msg)
		}
	}
	if want := "last (2026-11-30T10:00:20Z, step 3/3 t3): ValueError: step 2 failed"; !strings.Contains(st.Out.PauseReason, want) {
		t.Errorf("pause reason %q, want it to contain %q", st.Out.PauseReason, want)
	}
}

// TestChainedRunAcrossFailover: a chain in progress when its leader
// stops is followed by the next leader from the stored state: it watches
// the steps again, skips while they run, and ends the run on the last
// step's success.
func TestChainedRunAcrossFailover(t *testing.T) {
	s := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	yaml := fmt.Sprintf(chainYAML, "overlap: skip")
	first := newOutcomeHarness(t, yaml, t0.Add(time.Second), nil, nil)
	first.start(7)
	first.settle()
	first.at(10 * time.Second)
	first.report("e", s(10), outcome.Started)
	first.reportStep("e", s(10), step(0, outcome.Succeeded), step(1, outcome.Started))
	first.applied()
	first.stop()

	st := newMemStore(8)
	st.states = first.store.states
	if r := st.states["e"].Out.Newest(); r == nil || r.Step != 1 || r.Kind != outcome.Started {
		t.Fatalf("stored run %+v, want started at step 1", r)
	}
	second := newOutcomeHarness(t, yaml, t0.Add(15*time.Second), st, first.disp)
	second.start(8)
	second.settle()
	second.at(20 * time.Second)
	if got := second.runs("e", outcome.Skipped); got != 1 {
		t.Errorf("skipped %v while the chain ran, want 1", got)
	}
	second.reportStep("e", s(10), step(1, outcome.Succeeded), step(2, outcome.Succeeded))
	eventually(t, 5*time.Second, "the chain's success", func() bool { return second.runs("e", outcome.Succeeded) == 1 })
	second.at(30 * time.Second)
	eventually(t, 5*time.Second, "the slot after the chain", func() bool { return len(second.fires("e")) == 2 })
	if got := second.fires("e"); !slices.Equal(got, []int{10, 30}) {
		t.Errorf("published %v, want [10 30]", got)
	}
}
