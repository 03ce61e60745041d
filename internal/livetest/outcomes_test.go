package livetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/testkit/testutil"
)

// The outcome tests run real Celery workers (Debian's python3-celery)
// that send task events (-E) or store results, and judge beatd's overlap
// policies by what the workers actually ran: tasks.sleep returns the
// worker's own start and end times.

// status reads p's GET /status.
func (p *proc) status(t *testing.T) api.Status {
	t.Helper()
	code, body := p.get("/status")
	var st api.Status
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		return api.Status{}
	}
	return st
}

func entryOf(st api.Status, name string) (api.EntryStatus, bool) {
	for _, e := range st.Entries {
		if e.Name == name {
			return e, true
		}
	}
	return api.EntryStatus{}, false
}

func hasOutcome(e api.EntryStatus, outcome string) bool {
	for _, r := range e.Runs {
		if r.Outcome == outcome {
			return true
		}
	}
	return false
}

// execution is one run of tasks.sleep as its worker timed it.
type execution struct {
	id         string
	start, end float64
}

// executions reads every finished tasks.sleep result with mark from the
// result backend (database 1), in start order.
func executions(t *testing.T, rs *testutil.Redis, mark string) []execution {
	t.Helper()
	ctx := context.Background()
	c := rs.ClientDB(1)
	keys, err := c.Keys(ctx, "celery-task-meta-*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []execution
	for _, k := range keys {
		raw, err := c.Get(ctx, k).Bytes()
		if err != nil {
			continue
		}
		var meta struct {
			Status string `json:"status"`
			Result struct {
				Start float64 `json:"start"`
				End   float64 `json:"end"`
				Mark  string  `json:"mark"`
			} `json:"result"`
		}
		if json.Unmarshal(raw, &meta) != nil || meta.Status != "SUCCESS" || meta.Result.Mark != mark {
			continue
		}
		out = append(out, execution{id: strings.TrimPrefix(k, "celery-task-meta-"), start: meta.Result.Start, end: meta.Result.End})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// assertNoOverlap fails if any two executions ran at the same time.
func assertNoOverlap(t *testing.T, what string, ex []execution) {
	t.Helper()
	for i := 1; i < len(ex); i++ {
		if ex[i].start < ex[i-1].end {
			t.Errorf("%s: %s started at %.3f while %s ran until %.3f", what, ex[i].id, ex[i].start, ex[i-1].id, ex[i-1].end)
		}
	}
}

// TestOutcomesFromTaskEvents: workers started with -E report each run;
// beatd's status shows succeeded, failed (with the exception read from the
// solo pool's traceback), retried-then-succeeded; pause_after_failures
// pauses the failing entry with its exception as the reason; skip and
// buffer_one never let two runs of an entry execute at once, on a pool
// that would run them concurrently.
func TestOutcomesFromTaskEvents(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Events: true, Name: "fast@%h"})
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "slowq", Events: true, Pool: "prefork", Concurrency: 4, Name: "slow@%h"})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  ok: {task: tasks.add, every: 1s, args: [1, 2]}
  boom: {task: tasks.fail, every: 1s, pause_after_failures: 3}
  flaky: {task: tasks.flaky, every: 2s}
  skipper: {task: tasks.sleep, every: 1s, args: [2.5, skip], overlap: skip, options: {queue: slowq}}
  buffered: {task: tasks.sleep, every: 1s, args: [2.5, buffer], overlap: buffer_one, options: {queue: slowq}}
  allowed: {task: tasks.sleep, every: 1s, args: [2.5, allow], options: {queue: slowq}}
`)
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/outcomes/",
		"--broker", rs.URL(0), "--lease-ttl", "2s", "--id", "o1")

	waitFor(t, 40*time.Second, "boom paused after 3 failures", func() bool {
		e, _ := entryOf(p.status(t), "boom")
		return e.Paused
	})
	waitFor(t, 30*time.Second, "outcomes of every kind", func() bool {
		st := p.status(t)
		ok, _ := entryOf(st, "ok")
		flaky, _ := entryOf(st, "flaky")
		skipper, _ := entryOf(st, "skipper")
		return hasOutcome(ok, "succeeded") && hasOutcome(flaky, "succeeded") && hasOutcome(skipper, "skipped") && hasOutcome(skipper, "succeeded")
	})
	time.Sleep(8 * time.Second) // an observation window: several overlapping slots of each slow entry
	st := p.status(t)
	if st.OutcomeWarning != "" {
		t.Errorf("outcome warning while workers send events: %s", st.OutcomeWarning)
	}
	ok, _ := entryOf(st, "ok")
	for _, r := range ok.Runs {
		if r.Outcome == "succeeded" && (r.Worker == "" || !strings.HasPrefix(r.Worker, "fast@") || r.RuntimeSeconds <= 0 || r.StartedAt == nil) {
			t.Errorf("ok: succeeded run without its worker, runtime or start: %+v", r)
		}
	}
	if ok.LastSuccessAt == nil {
		t.Error("ok: no last success")
	}
	// The entries API shows the same outcomes.
	code, body := p.get("/api/v1/entries/ok")
	var apiEntry api.Entry
	if code != 200 || json.Unmarshal([]byte(body), &apiEntry) != nil || !hasOutcome(api.EntryStatus{Outcomes: apiEntry.Outcomes}, "succeeded") {
		t.Errorf("entries API: %d %s", code, body)
	}
	boom, _ := entryOf(st, "boom")
	if !strings.Contains(boom.PauseReason, "ZeroDivisionError: division by zero") || boom.ConsecutiveFailures < 3 || boom.LastFailureAt == nil {
		t.Errorf("boom: pause reason %q, failures %d, last failure %v", boom.PauseReason, boom.ConsecutiveFailures, boom.LastFailureAt)
	}
	for _, r := range boom.Runs {
		if r.Outcome == "failed" && r.Exception != "ZeroDivisionError" {
			t.Errorf("boom: failed run's exception %q %q", r.Exception, r.Message)
		}
	}
	skips := executions(t, rs, "skip")
	if len(skips) < 2 {
		t.Errorf("skip ran %d times in the window", len(skips))
	}
	assertNoOverlap(t, "skip", skips)
	assertNoOverlap(t, "buffer_one", executions(t, rs, "buffer"))
	// The control: without a policy the same task does overlap, so the
	// pool above could have run the others concurrently.
	allowed := executions(t, rs, "allow")
	overlapped := false
	for i := 1; i < len(allowed); i++ {
		overlapped = overlapped || allowed[i].start < allowed[i-1].end
	}
	if !overlapped {
		t.Errorf("overlap: allow never overlapped (%d runs): the test cannot tell skip from allow", len(allowed))
	}
	// buffer_one publishes the held slot as the run ends: back to back.
	buf := executions(t, rs, "buffer")
	if len(buf) < 3 {
		t.Fatalf("buffer_one ran %d times", len(buf))
	}
	for i := 1; i < len(buf); i++ {
		if gap := buf[i].start - buf[i-1].end; gap > 3 { // events are flushed about every second, and -race on 2 cores slows all
			t.Errorf("buffer_one: %.2fs between a run's end and the held slot's start", gap)
		}
	}
	_, metrics := p.get("/metrics")
	for _, want := range []string{`beatd_runs_total{entry="skipper",outcome="skipped"}`, `beatd_runs_total{entry="boom",outcome="failed"}`,
		`beatd_entry_consecutive_failures{entry="boom"}`, `beatd_outcome_reports_total{source="task_events"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(metrics, `beatd_runs_total{entry="skipper",outcome="skipped"} 0`) {
		t.Error("no skipped run counted")
	}
}

// TestLostRunAfterWorkerKill: a worker killed -9 mid-task reports nothing;
// the run blocks overlap: skip until overlap_timeout, is then marked lost,
// and the entry fires again.
func TestLostRunAfterWorkerKill(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	// prefork, not solo: a solo worker blocked in a task holds its
	// buffered task-started event until the task ends.
	w := testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Events: true, Pool: "prefork", Concurrency: 1,
		Name: "doomed@%h"})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml",
		"entries:\n  long: {task: tasks.sleep, every: 1s, args: [60, long], overlap: skip, overlap_timeout: 6s}\n")
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/lost/",
		"--broker", rs.URL(0), "--lease-ttl", "2s", "--id", "l1")
	var started api.RunOutcome
	waitFor(t, 30*time.Second, "the long run started", func() bool {
		e, _ := entryOf(p.status(t), "long")
		for _, r := range e.Runs {
			if r.Outcome == "started" {
				started = r
				return true
			}
		}
		return false
	})
	w.Kill()
	killedAt := time.Now()
	var lastRuns []api.RunOutcome
	defer func() {
		if t.Failed() {
			t.Logf("the last runs status showed: %+v", lastRuns)
		}
	}()
	waitFor(t, 20*time.Second, "the run marked lost", func() bool {
		e, _ := entryOf(p.status(t), "long")
		lastRuns = e.Runs
		for _, r := range e.Runs {
			if r.TaskID == started.TaskID && r.Outcome == "lost" {
				return true
			}
		}
		return false
	})
	// Lost at overlap_timeout after its publish, not before: the worker
	// was only killed after the run started.
	if lostAfter := time.Since(started.PublishedAt); lostAfter < 6*time.Second {
		t.Errorf("lost %.1fs after its publish, before overlap_timeout", lostAfter.Seconds())
	}
	if took := time.Since(killedAt); took > 10*time.Second {
		t.Errorf("lost %.1fs after the kill", took.Seconds())
	}
	if !strings.Contains(p.output(), "run lost: no outcome within overlap_timeout") {
		t.Error("no log line for the lost run")
	}
	// Status reads the state from etcd, up to --state-interval behind,
	// and the new run is soon followed by skipped slots (its worker is
	// dead too): any published run after the lost one will do.
	waitFor(t, 15*time.Second, "a new run after the lost one", func() bool {
		e, _ := entryOf(p.status(t), "long")
		for _, r := range e.Runs {
			if r.Outcome == "published" && r.TaskID != started.TaskID && r.Slot.After(started.Slot) {
				return true
			}
		}
		return false
	})
	_, metrics := p.get("/metrics")
	if !strings.Contains(metrics, `beatd_runs_total{entry="long",outcome="lost"} 1`) {
		t.Errorf("lost run not counted:\n%s", grepLines(metrics, "beatd_runs_total"))
	}
}

// TestOutcomesFromResultBackendOnly: workers without -E; beatd reads the
// result backend and still knows each run's outcome, and overlap: skip
// still holds.
func TestOutcomesFromResultBackendOnly(t *testing.T) {
	t.Parallel() // judges what happened, not how fast: see main_test.go
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Pool: "threads", Concurrency: 3})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  ok: {task: tasks.add, every: 1s, args: [1, 2]}
  boom: {task: tasks.fail, every: 1s}
  skipper: {task: tasks.sleep, every: 1s, args: [2.5, rb-skip], overlap: skip}
  named: {task: tasks.periodic_name, every: 1s}
`)
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/results/",
		"--broker", rs.URL(0), "--result-backend", rs.URL(1), "--task-events=false", "--lease-ttl", "2s", "--id", "r1")
	waitFor(t, 40*time.Second, "outcomes from the result backend", func() bool {
		st := p.status(t)
		ok, _ := entryOf(st, "ok")
		boom, _ := entryOf(st, "boom")
		skipper, _ := entryOf(st, "skipper")
		named, _ := entryOf(st, "named")
		return hasOutcome(ok, "succeeded") && hasOutcome(boom, "failed") && hasOutcome(skipper, "skipped") && hasOutcome(skipper, "succeeded") &&
			len(named.Runs) > 0 && named.Runs[len(named.Runs)-1].Outcome == "succeeded"
	})
	st := p.status(t)
	boom, _ := entryOf(st, "boom")
	for _, r := range boom.Runs {
		if r.Outcome == "failed" && (r.Exception != "ZeroDivisionError" || r.Message != "division by zero") {
			t.Errorf("boom: exception from the result backend %q %q", r.Exception, r.Message)
		}
	}
	if st.OutcomeWarning != "" {
		t.Errorf("outcome warning with a result backend that reports: %s", st.OutcomeWarning)
	}
	// django-celery-results links a result to its periodic task by the
	// periodic_task_name beatd sends, as django-celery-beat does.
	named, _ := entryOf(st, "named")
	if len(named.Runs) == 0 {
		t.Fatal("named: no runs")
	}
	raw, err := rs.ClientDB(1).Get(context.Background(), "celery-task-meta-"+named.Runs[len(named.Runs)-1].TaskID).Bytes()
	var meta struct {
		Result string `json:"result"`
	}
	if err != nil || json.Unmarshal(raw, &meta) != nil || meta.Result != "named" {
		t.Errorf("the worker saw periodic_task_name %q (%v), want the entry's name", meta.Result, err)
	}
	time.Sleep(5 * time.Second) // an observation window: two more overlapping slots
	assertNoOverlap(t, "skip (result backend)", executions(t, rs, "rb-skip"))
}

// TestNoOutcomeSourceWarns: neither task events nor a result backend:
// status and the log say so, instead of staying silent. The cases share
// one Redis, etcd and worker (one without -E sends no events in either
// case; a Celery worker takes seconds to start); each runs its own beatd
// under its own prefix, stopped before the next case starts.
func TestNoOutcomeSourceWarns(t *testing.T) {
	t.Parallel() // judges what happened, not how fast: see main_test.go
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery"})
	for i, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"events off, no backend", []string{"--task-events=false"}, "no outcome source"},
		{"workers without -E", nil, "no task events in 3s: start the workers with -E or set --result-backend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := fmt.Sprintf("/beatd/silent%d/", i)
			cfg := writeFile(t, t.TempDir(), "schedules.yaml", "entries:\n  ok: {task: tasks.add, every: 1s, args: [1, 2]}\n")
			p := startBeatd(t, nil, append([]string{"--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","),
				"--prefix", prefix, "--broker", rs.URL(0), "--lease-ttl", "2s", "--id", "s1", "--outcome-silence", "3s"}, tc.args...)...)
			waitFor(t, 30*time.Second, "the warning in status", func() bool { return strings.Contains(p.status(t).OutcomeWarning, tc.want) })
			waitFor(t, 30*time.Second, "the warning in the log", func() bool { return strings.Contains(p.output(), tc.want) })
			code, out := runCLI(t, "status", "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", prefix)
			if code != 0 || !strings.Contains(out, tc.want) {
				t.Errorf("beatd status: exit %d, no warning:\n%s", code, out)
			}
		})
	}
}

// TestOverlapSkipAcrossFailover: the leader is killed -9 while a long run
// is in progress; the new leader knows the run is unfinished and skips
// until it ends: the worker never runs two at once. The run lasts 12s so
// that it is still running when the new leader starts watching it:
// status shows it started only once the old leader's state write says so
// (up to --state-interval after the start), and a task-succeeded event
// sent while no leader watches is missed (without a result backend the
// new leader then waits for overlap_timeout).
func TestOverlapSkipAcrossFailover(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Events: true, Pool: "prefork", Concurrency: 4})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml",
		"entries:\n  long: {task: tasks.sleep, every: 1s, args: [12, failover], overlap: skip, catchup: all}\n")
	args := func(id string) []string {
		return []string{"--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/fo/",
			"--broker", rs.URL(0), "--lease-ttl", "2s", "--id", id}
	}
	a := startBeatd(t, nil, args("a")...)
	waitFor(t, 20*time.Second, "a leads", func() bool { return a.status(t).Leader })
	b := startBeatd(t, nil, args("b")...)
	waitFor(t, 30*time.Second, "the long run started", func() bool {
		e, _ := entryOf(a.status(t), "long")
		return len(e.Runs) > 0 && hasOutcome(e, "started")
	})
	a.Kill()
	waitFor(t, 20*time.Second, "b leads", func() bool { return b.status(t).Leader })
	waitFor(t, 30*time.Second, "two runs done", func() bool { return len(executions(t, rs, "failover")) >= 2 })
	ex := executions(t, rs, "failover")
	assertNoOverlap(t, "skip across failover", ex)
	e, _ := entryOf(b.status(t), "long")
	if !hasOutcome(e, "skipped") {
		t.Errorf("the new leader skipped nothing: %+v", e.Runs)
	}
}

// runCLI runs the beatd binary with args; it returns the exit code and
// everything it wrote.
func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(beatdBin, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	default:
		t.Fatal(err)
		return -1, ""
	}
}

// TestOverlapOverRabbitMQ: the same policies on RabbitMQ, with the
// outcomes from the celeryev topic exchange: skip and buffer_one never
// run two at once on a pool that would, pause_after_failures pauses.
func TestOverlapOverRabbitMQ(t *testing.T) {
	rb := sharedRabbit(t)
	rs := testutil.MustStartRedis(t) // the workers' result backend, where the executions are read
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Events: true, Pool: "prefork", Concurrency: 4,
		Name: "rabbit@%h", Env: []string{"BROKER_URL=" + rb.URL()}})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  skipper: {task: tasks.sleep, every: 1s, args: [2.5, amqp-skip], overlap: skip}
  buffered: {task: tasks.sleep, every: 1s, args: [2.5, amqp-buffer], overlap: buffer_one}
  boom: {task: tasks.fail, every: 1s, pause_after_failures: 2}
`)
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/amqp-outcomes/",
		"--broker", rb.URL(), "--lease-ttl", "2s", "--id", "q1")
	waitFor(t, 60*time.Second, "outcomes over RabbitMQ", func() bool {
		st := p.status(t)
		skipper, _ := entryOf(st, "skipper")
		boom, _ := entryOf(st, "boom")
		return hasOutcome(skipper, "skipped") && hasOutcome(skipper, "succeeded") && boom.Paused
	})
	time.Sleep(6 * time.Second) // an observation window: more overlapping slots
	for _, mark := range []string{"amqp-skip", "amqp-buffer"} {
		ex := executions(t, rs, mark)
		if len(ex) < 2 {
			t.Errorf("%s ran %d times", mark, len(ex))
		}
		assertNoOverlap(t, mark, ex)
	}
	boom, _ := entryOf(p.status(t), "boom")
	if !strings.Contains(boom.PauseReason, "ZeroDivisionError") {
		t.Errorf("boom: pause reason %q", boom.PauseReason)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
