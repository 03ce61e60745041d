package livetest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// sqsEnv is what beatd and the worker need to reach the emulator: AWS
// credentials from the environment (the emulator checks none, but the
// AWS chain must yield some) and no instance metadata lookups.
var sqsEnv = []string{"AWS_ACCESS_KEY_ID=beatd-live", "AWS_SECRET_ACCESS_KEY=beatd-live", "AWS_EC2_METADATA_DISABLED=true"}

// TestSQSCeleryWorkerRunsWhatBeatdSends: beatd on the SQS emulator, and an
// unmodified `celery worker` on Kombu's SQS transport (boto3, pycurl)
// consuming from it, with a queue_name_prefix: each entry's task runs with
// its args and kwargs, from its queue (a dotted name, a .fifo queue), an
// expired message is not run, and the outcomes reach beatd's status from
// the result backend (Celery's events do not travel over SQS).
func TestSQSCeleryWorkerRunsWhatBeatdSends(t *testing.T) {
	e := sharedSQS(t)
	rs := testutil.MustStartRedis(t) // the worker's result backend
	etcd := testutil.MustStartEmbeddedEtcd(t)
	prefix := "live" + strings.ReplaceAll(t.Name()[len(t.Name())-6:], "/", "") + "-"
	opts, _ := json.Marshal(map[string]any{"region": "us-east-1", "is_secure": false, "queue_name_prefix": prefix, "polling_interval": 0.2})
	w := testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery,reports.daily,jobs.fifo", Name: "sqs@%h",
		Env: append([]string{"BROKER_URL=sqs://127.0.0.1:" + strings.TrimPrefix(e.Endpoint(), "http://127.0.0.1:"),
			"SQS_TRANSPORT_OPTIONS=" + string(opts)}, sqsEnv...)})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  add: {task: tasks.add, every: 1s, args: [2, 3]}
  hello: {task: tasks.hello, every: 1s, kwargs: {who: "Zoë ☃"}, options: {queue: reports.daily, expires: 30}}
  fifo: {task: tasks.add, every: 1s, args: [40, 2], options: {queue: jobs.fifo}}
  gone: {task: tasks.add, every: 1s, args: [9, 9], options: {expires: "2020-01-01T00:00:00Z"}}
  boom: {task: tasks.fail, every: 1s}
`)
	p := startBeatd(t, sqsEnv, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/sqs-live/",
		"--broker", e.BrokerURL()+"&queue_name_prefix="+prefix, "--result-backend", rs.URL(1), "--task-events=false",
		"--lease-ttl", "2s", "--id", "s1")
	want := map[string]string{"add": "5", "hello": `"hello Zoë ☃"`, "fifo": "42"}
	waitFor(t, 60*time.Second, "the worker's results and beatd's outcomes", func() bool {
		st := p.status(t)
		for name := range want {
			if e, _ := entryOf(st, name); !hasOutcome(e, "succeeded") {
				return false
			}
		}
		boom, _ := entryOf(st, "boom")
		return hasOutcome(boom, "failed")
	})
	st := p.status(t)
	for name, result := range want {
		e, _ := entryOf(st, name)
		var checked bool
		for _, r := range e.Runs {
			if r.Outcome != "succeeded" {
				continue
			}
			res, ok := w.Result(t, r.TaskID)
			var got, exp any
			_ = json.Unmarshal(res.Result, &got)
			_ = json.Unmarshal([]byte(result), &exp)
			if !ok || res.Status != "SUCCESS" || got != exp {
				t.Errorf("%s: task %s: %s %s, want SUCCESS %s", name, r.TaskID, res.Status, res.Result, result)
			}
			checked = true
			break
		}
		if !checked {
			t.Errorf("%s: no succeeded run in status", name)
		}
	}
	gone, _ := entryOf(st, "gone")
	for _, r := range gone.Runs {
		if res, ok := w.Result(t, r.TaskID); ok && res.Status == "SUCCESS" {
			t.Errorf("an expired message ran: %s", r.TaskID)
		}
	}
	if len(gone.Runs) == 0 {
		t.Error("gone: never sent")
	}
}

// TestSQSStartupErrors: what beatd refuses at start on SQS, with the
// reason.
func TestSQSStartupErrors(t *testing.T) {
	e := sharedSQS(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", "entries:\n  add: {task: tasks.add, every: 1s, options: {queue: reports}}\n")
	for _, tt := range []struct{ name, url, want string }{
		{"credentials in the URL", "sqs://AKIAEXAMPLE:s3cr3tV4lue@127.0.0.1:1", "carries credentials"},
		{"queue not predefined", e.BrokerURL() + "&predefined_queues=celery=" + e.QueueURL("celery"), `queue \"reports\" is not in predefined_queues`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := failsAtStart(t, sqsEnv, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","),
				"--prefix", "/beatd/sqs-start/", "--broker", tt.url, "--id", "s1")
			if !strings.Contains(out, tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, tail(out, 20))
			}
			if strings.Contains(out, "s3cr3tV4lue") {
				t.Error("the output shows the URL's secret")
			}
		})
	}
}

// TestSQSOverlapAndPauseFromResultBackend: on SQS, with no task events,
// the result backend alone drives overlap and pause_after_failures: a
// skip entry never runs two at once on a pool that would, and a failing
// entry pauses.
func TestSQSOverlapAndPauseFromResultBackend(t *testing.T) {
	e := sharedSQS(t)
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	prefix := "ovl-"
	opts, _ := json.Marshal(map[string]any{"region": "us-east-1", "is_secure": false, "queue_name_prefix": prefix, "polling_interval": 0.2})
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Pool: "threads", Concurrency: 4, Name: "sqsovl@%h",
		Env: append([]string{"BROKER_URL=sqs://127.0.0.1:" + strings.TrimPrefix(e.Endpoint(), "http://127.0.0.1:"),
			"SQS_TRANSPORT_OPTIONS=" + string(opts)}, sqsEnv...)})
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  skipper: {task: tasks.sleep, every: 1s, args: [2.5, sqs-skip], overlap: skip}
  boom: {task: tasks.fail, every: 1s, pause_after_failures: 2}
`)
	p := startBeatd(t, sqsEnv, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/sqs-ovl/",
		"--broker", e.BrokerURL()+"&queue_name_prefix="+prefix, "--result-backend", rs.URL(1), "--task-events=false",
		"--lease-ttl", "2s", "--id", "o1")
	waitFor(t, 60*time.Second, "skip and pause from the result backend on SQS", func() bool {
		st := p.status(t)
		skipper, _ := entryOf(st, "skipper")
		boom, _ := entryOf(st, "boom")
		return hasOutcome(skipper, "skipped") && hasOutcome(skipper, "succeeded") && boom.Paused
	})
	time.Sleep(4 * time.Second) // an observation window: more overlapping slots
	ex := executions(t, rs, "sqs-skip")
	if len(ex) < 2 {
		t.Errorf("skipper ran %d times", len(ex))
	}
	assertNoOverlap(t, "skip (SQS, result backend)", ex)
	boom, _ := entryOf(p.status(t), "boom")
	if !strings.Contains(boom.PauseReason, "ZeroDivisionError") {
		t.Errorf("boom: pause reason %q", boom.PauseReason)
	}
}
