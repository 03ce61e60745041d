package outcome

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	amqpbroker "github.com/beatd/beatd/broker/amqp"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
)

// TestTaskEventsOverRabbitMQ: a real worker started with -E on RabbitMQ
// reports beatd's runs on the celeryev topic exchange; RunAMQPEvents reads
// them into the feed: received, started, then succeeded or failed with
// the exception.
func TestTaskEventsOverRabbitMQ(t *testing.T) {
	rb := testutil.MustStartRabbitMQ(t, t.TempDir()) // the package's only RabbitMQ test
	rs := testutil.MustStartRedis(t)                 // the worker's result backend only
	cfg, err := config.Parse("ev.yaml", []byte("entries:\n  ok: {task: tasks.add, every: 1m, args: [1, 2]}\n  boom: {task: tasks.fail, every: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	clock := clockwork.NewRealClock()
	feed := NewFeed(clock, 64)
	ctx, cancel := context.WithCancel(context.Background())
	dial, err := amqpbroker.EventsDialer(rb.URL(), "", "ev")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunAMQPEvents(ctx, AMQPEvents{Dial: dial, Name: "ev", Logger: slog.New(slog.DiscardHandler)}, feed)
	}()
	t.Cleanup(func() { cancel(); <-done })
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Events: true, Pool: "prefork", Concurrency: 2,
		Name: "rabbit@%h", Env: []string{"BROKER_URL=" + rb.URL()}})

	// A fenced publisher whose term 1 is current.
	a, err := amqpbroker.NewAMQP(amqpbroker.AMQPOptions{URL: rb.URL(), Cluster: "ev", Verify: func(context.Context, int64) error { return nil },
		Queues: func() amqpbroker.Queues { return cfg.AMQP }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.RaiseFence(ctx, 1); err != nil {
		t.Fatal(err)
	}
	slot := time.Now().UTC().Truncate(time.Minute)
	var fires []celery.Fire
	want := map[string]Kind{}
	for _, e := range cfg.Entries {
		task, err := celery.Compile(e.Spec(), "ev", "beatd@test", "")
		if err != nil {
			t.Fatal(err)
		}
		id := task.SlotID(slot)
		feed.Watch(string(id[:]), e.Name)
		fires = append(fires, celery.Fire{Task: task, Slot: slot})
		want[e.Name] = map[string]Kind{"ok": Succeeded, "boom": Failed}[e.Name]
	}
	res := make([]broker.Result, len(fires))
	if err := a.Publish(ctx, 1, fires, res); err != nil {
		t.Fatal(err)
	}
	seen := map[string][]Kind{}
	deadline := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case r := <-feed.Reports():
			seen[r.Entry] = append(seen[r.Entry], r.Kind)
			if r.Worker == "" || r.At.IsZero() {
				t.Errorf("%s: report without worker or time: %+v", r.Entry, r)
			}
			if r.Kind == Failed && (r.ExcType != "ZeroDivisionError" || r.ExcMessage != "division by zero") {
				t.Errorf("boom: exception %q %q", r.ExcType, r.ExcMessage)
			}
			if want[r.Entry] == r.Kind {
				delete(want, r.Entry)
			}
		case <-deadline:
			t.Fatalf("after 30s, still waiting for %v; saw %v", want, seen)
		}
	}
	for name, kinds := range seen {
		if len(kinds) < 3 || kinds[0] != Received || kinds[1] != Started {
			t.Errorf("%s: reports %v, want received, started, then the end", name, kinds)
		}
	}
}
