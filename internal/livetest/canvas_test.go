package livetest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// record is one run of tasks.record or tasks.record_error, as the task
// itself wrote it.
type record struct {
	Task     string `json:"task"`
	ID       string `json:"id"`
	RootID   string `json:"root_id"`
	ParentID string `json:"parent_id"`
	Args     []any  `json:"args"`
	BeatSlot string `json:"beat_slot"`
}

func records(t *testing.T, rs *testutil.Redis, list string) []record {
	t.Helper()
	raw, err := rs.Client().LRange(context.Background(), list, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]record, len(raw))
	for i, r := range raw {
		d := json.NewDecoder(strings.NewReader(r))
		d.UseNumber() // an epoch prints as the task got it
		if err := d.Decode(&out[i]); err != nil {
			t.Fatalf("%v: %s", err, r)
		}
	}
	return out
}

// TestPeriodicChainOnACeleryWorker: beatd runs a periodic chain of three
// tasks with a link_error on an unmodified Celery worker. For each slot
// the tasks' own records show the order fetch, transform, notify (which
// fails), then the error callback; each step got its own arguments, the
// second and third the previous step's result first; the first step's
// templated argument is its slot (the beat_slot header), and each step's
// task id is the one beatd derived. A link on another entry runs with its
// task's result.
//
// The worker sends task events (-E), and a chained run is the whole
// chain (chainOutcomes): a chain whose second step fails shows failed at
// that step in /status, and a chain that succeeds shows succeeded only
// once its last step did, with overlap: skip holding the next slot until
// then, on a pool that would run them at once.
func TestPeriodicChainOnACeleryWorker(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery,steps", Events: true, Pool: "prefork", Concurrency: 4})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  etl:
    task: tasks.record
    every: 2s
    args: [fetch, "{{ slot.epoch }}"]
    kwargs: {log: canvas}
    chain:
      - {task: tasks.record, args: [transform], kwargs: {log: canvas}, options: {queue: steps}}
      - {task: tasks.record, args: [notify], kwargs: {log: canvas, fail: true}}
    link_error: {task: tasks.record_error, kwargs: {log: canvas}}
  linked:
    task: tasks.add
    every: 2s
    args: [2, 3]
    link: {task: tasks.record, kwargs: {log: linked}}
  broken:
    task: tasks.record
    every: 2s
    args: [fetch]
    kwargs: {log: broken}
    chain:
      - {task: tasks.record, args: [transform], kwargs: {log: broken, fail: true}}
      - {task: tasks.record, args: [load], kwargs: {log: broken}}
    link_error: {task: tasks.record_error, kwargs: {log: broken}}
  steady:
    task: tasks.sleep
    every: 1s
    args: [0.2, steady-1]
    overlap: skip
    chain:
      - {task: tasks.sleep, args: [0.2, steady-2], immutable: true}
      - {task: tasks.sleep, args: [1.2, steady-3], immutable: true}
`)
	began := time.Now()
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/canvas/",
		"--broker", rs.URL(0), "--lease-ttl", "2s", "--id", "c1",
		"--state-interval", "200ms") // status reads a run's progress from etcd: a step must show before the next

	chainOutcomes(t, p, rs)
	t.Logf("chain outcomes judged after %s", time.Since(began).Round(time.Millisecond))

	// A slot is complete when its four records are in.
	complete := func() map[string][]record {
		bySlot := map[string][]record{}
		for _, r := range records(t, rs, "canvas") {
			bySlot[r.RootID] = append(bySlot[r.RootID], r)
		}
		for root, rs := range bySlot {
			if len(rs) < 4 {
				delete(bySlot, root)
			}
		}
		return bySlot
	}
	waitFor(t, 60*time.Second, "two slots of the chain run through", func() bool { return len(complete()) >= 2 })
	for root, recs := range complete() {
		if len(recs) != 4 {
			t.Errorf("slot %s: %d records, want 4: %+v", root, len(recs), recs)
			continue
		}
		var id [36]byte
		copy(id[:], root)
		s1, s2 := celery.StepID(id, 1), celery.StepID(id, 2)
		fetch, transform, notify, failed := recs[0], recs[1], recs[2], recs[3]
		slot, err := time.Parse(time.RFC3339Nano, fetch.BeatSlot)
		if err != nil {
			t.Errorf("slot %s: the first step has no beat_slot header (%v): %+v", root, err, fetch)
			continue
		}
		epoch := strconv.FormatInt(slot.Unix(), 10)
		for _, c := range []struct {
			r                record
			task, id, parent string
			args             string
		}{
			{fetch, "record", root, "", "[fetch " + epoch + "]"},
			{transform, "record", string(s1[:]), root, "[fetch+" + epoch + " transform]"},
			{notify, "record", string(s2[:]), string(s1[:]), "[fetch+" + epoch + "+transform notify]"},
			{failed, "record_error", "", "", "[" + string(s2[:]) + "]"},
		} {
			if got := fmt.Sprint(c.r.Args); c.r.Task != c.task || got != c.args || (c.id != "" && c.r.ID != c.id) || c.r.ParentID != c.parent {
				t.Errorf("slot %s: got %s id %s parent %s args %s\n want %s id %s parent %s args %s",
					fetch.BeatSlot, c.r.Task, c.r.ID, c.r.ParentID, got, c.task, c.id, c.parent, c.args)
			}
		}
	}
	waitFor(t, 30*time.Second, "the link ran", func() bool { return len(records(t, rs, "linked")) > 0 })
	for _, r := range records(t, rs, "linked") {
		if fmt.Sprint(r.Args) != "[5]" || r.ParentID != r.RootID {
			t.Errorf("link: %+v, want args [5] with the linked task as parent", r)
		}
	}
}

// chainOutcomes judges, from /status polled every 50 ms (the builder the
// CLI and the console use) and from what the worker ran, the runs of
// broken (its second step fails) and steady (three sleeps, the last the
// longest, every second under overlap: skip).
func chainOutcomes(t *testing.T, p *proc, rs *testutil.Redis) {
	t.Helper()
	began := time.Now()
	var failed *api.RunOutcome
	seen := map[string][]string{} // each of steady's runs' outcomes as shown, in order, by task id
	last := map[string]api.RunOutcome{}
	waitFor(t, 60*time.Second, "broken's chain failed, and two of steady's succeeded after their last step ran", func() bool {
		st := p.status(t)
		if b, ok := entryOf(st, "broken"); ok {
			for _, r := range b.Runs {
				if r.Outcome == "failed" {
					failed = &r
				}
			}
		}
		s, _ := entryOf(st, "steady")
		for _, r := range s.Runs {
			if r.TaskID == "" {
				continue // skipped slots
			}
			if h, txt := seen[r.TaskID], r.OutcomeText(); len(h) == 0 || h[len(h)-1] != txt {
				seen[r.TaskID] = append(h, txt)
			}
			last[r.TaskID] = r
		}
		n := 0
		for _, h := range seen {
			if h[len(h)-1] == "succeeded" && slices.ContainsFunc(h, func(s string) bool { return strings.Contains(s, "step 3/3") }) {
				n++
			}
		}
		return failed != nil && n >= 2
	})
	t.Logf("after %s, steady's runs as /status showed them: %v", time.Since(began).Round(time.Millisecond), seen)

	// broken: failed at its second step, with that step's exception; its
	// third never ran, and its link_error got the second step's id.
	if failed.Step != "step 2/3 tasks.record" || failed.Exception != "ValueError" || failed.Message != "asked to fail" {
		t.Errorf("broken's failed run: step %q, exception %q %q; want step 2/3 tasks.record, ValueError: asked to fail",
			failed.Step, failed.Exception, failed.Message)
	}
	for _, r := range records(t, rs, "broken") {
		var root [36]byte
		copy(root[:], r.RootID)
		s1 := celery.StepID(root, 1)
		switch {
		case fmt.Sprint(r.Args) == "[load]":
			t.Errorf("broken's third step ran after its second failed: %+v", r)
		case r.Task == "record_error" && fmt.Sprint(r.Args) != "["+string(s1[:])+"]":
			t.Errorf("broken's link_error got %v, want the failed step's id %s", r.Args, s1)
		}
	}

	// steady: succeeded only once the last step had: its time is the last
	// step's task-succeeded event's, after that step ended on the worker.
	ends := map[string]float64{}
	for _, x := range executions(t, rs, "steady-3") {
		ends[x.id] = x.end
	}
	for id, h := range seen {
		r := last[id]
		if r.Outcome != "succeeded" {
			continue
		}
		var head [36]byte
		copy(head[:], id)
		s2 := celery.StepID(head, 2)
		end, ok := ends[string(s2[:])]
		switch {
		case !ok:
			t.Errorf("steady's run %s succeeded (%v) while its last step has no result", id, h)
		case r.UpdatedAt == nil || float64(r.UpdatedAt.UnixNano())/1e9 < end-0.001:
			t.Errorf("steady's run %s succeeded at %v, before its last step ended (%.3f): %v", id, r.UpdatedAt, end, h)
		case r.Step != "":
			t.Errorf("steady's succeeded run %s shows a step: %q", id, r.Step)
		}
	}
	// overlap: skip held each next slot until the whole chain ended: no
	// step of one run ran while another run's did, on a pool of 4.
	var all []execution
	for _, m := range []string{"steady-1", "steady-2", "steady-3"} {
		all = append(all, executions(t, rs, m)...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].start < all[j].start })
	assertNoOverlap(t, "steady's chain", all)
	if s, _ := entryOf(p.status(t), "steady"); !hasOutcome(s, "skipped") {
		t.Errorf("steady skipped no slot while its chain ran: %+v", s.Runs)
	}
}
