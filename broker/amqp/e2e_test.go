package amqp

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestAMQPCeleryWorkerRuns publishes through RabbitMQ to a real Celery
// worker (-P solo) and checks each task's final state.
func TestAMQPCeleryWorkerRuns(t *testing.T) {
	rb := sharedRabbit(t)
	rs := testutil.MustStartRedis(t) // the worker's result backend only
	w := testutil.MustStartCeleryWorkerAMQP(t, rs, rb.URL(), "celery,e2eprio", "PRIORITY_QUEUE=e2eprio")
	cfg, err := config.Parse("e2e.yaml", []byte(`
amqp:
  queues:
    e2eprio: {queue_arguments: {x-max-priority: 10}}
entries:
  add:     {task: tasks.add, every: 1m, args: [2, 3]}
  unicode: {task: tasks.hello, every: 1m, kwargs: {who: "Zoë ☃ 日本"}}
  prio:    {task: tasks.add, every: 1m, args: [40, 2], options: {queue: e2eprio, priority: 7}}
  header:  {task: tasks.header, every: 1m, args: [x-team], options: {headers: {x-team: data}}}
  expires: {task: tasks.add, every: 1m, args: [1, 1], options: {expires: 60}}
  gone:    {task: tasks.add, every: 1m, args: [9, 9], options: {expires: "2020-01-01T00:00:00Z"}}
  unread:  {task: tasks.add, every: 1m, args: [7, 7], options: {queue: e2eunread, expires: 1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	a := fencedAMQP(t, rb, uniq("e2e"), cfg)
	ctx := context.Background()
	slot := time.Now().UTC().Truncate(time.Minute)
	fires := map[string]*celery.Fire{}
	for _, e := range cfg.Entries {
		task, err := celery.Compile(e.Spec(), "e2e", "beatd@test", "")
		if err != nil {
			t.Fatal(err)
		}
		fires[e.Name] = &celery.Fire{Task: task, Slot: slot}
	}
	publish := func(names ...string) {
		t.Helper()
		batch := make([]celery.Fire, len(names))
		for i, n := range names {
			batch[i] = *fires[n]
		}
		res := make([]broker.Result, len(batch))
		if err := a.Publish(ctx, 1, batch, res); err != nil {
			t.Fatal(err)
		}
		for i, n := range names {
			if res[i] != broker.ResultOK {
				t.Fatalf("%s: %v", n, res[i])
			}
			fires[n].ID = batch[i].ID
		}
	}
	// "unread" goes to a queue nobody consumes, with a 1 s TTL, "gone" to
	// the worker with an expiry in the past.
	publish("unread", "gone")
	publish("add", "unicode", "prio", "header", "expires")
	want := map[string]string{"add": "5", "unicode": `"hello Zoë ☃ 日本"`, "prio": "42", "header": `"data"`, "expires": "2"}
	for name, result := range want {
		r := w.WaitResult(t, string(fires[name].ID[:]), 60*time.Second)
		var got, exp any
		_ = json.Unmarshal(r.Result, &got)
		_ = json.Unmarshal([]byte(result), &exp)
		if r.Status != "SUCCESS" || got != exp {
			t.Errorf("%s: %s %s, want SUCCESS %s", name, r.Status, r.Result, result)
		}
	}
	// "gone" was ahead of them in the same queue: the broker dropped it
	// (expiration 0) or the worker revoked it; it never ran.
	if r, ok := w.Result(t, string(fires["gone"].ID[:])); ok && r.Status == "SUCCESS" {
		t.Errorf("an expired message ran: %s %s", r.Status, r.Result)
	}
	// RabbitMQ drops the unread message once its TTL passes.
	conn := testutil.DialRabbit(t, rb)
	testutil.EventuallyErr(t, 30*time.Second, 200*time.Millisecond, "the expired message to leave the queue", func() error {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		q, err := ch.QueueDeclarePassive("e2eunread", true, false, false, false, nil)
		ch.Close()
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages != 0 {
			return fmt.Errorf("still queued: %+v", q)
		}
		return nil
	})
	if r, ok := w.Result(t, string(fires["unread"].ID[:])); ok {
		t.Errorf("the unread message has a result: %+v", r)
	}
}
