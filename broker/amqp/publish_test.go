package amqp

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestAMQPUnroutableIsAnError: a message the broker cannot route is
// returned (mandatory) and is an error naming the entry, as is an
// exchange that does not exist and a queue the workers declared otherwise;
// the other fires of the batch are published.
func TestAMQPUnroutableIsAnError(t *testing.T) {
	rb := sharedRabbit(t)
	conn := testutil.DialRabbit(t, rb)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	exch, okq, lazy := uniq("unbound"), uniq("okq"), uniq("lazy")
	if err := ch.ExchangeDeclare(exch, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// The workers declared this queue lazy; beatd's config does not say so.
	if _, err := ch.QueueDeclare(lazy, true, false, false, false, map[string]any{"x-queue-mode": "lazy"}); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	cfg, err := config.Parse("unroutable.yaml", []byte(`entries:
  lost:    {task: tasks.add, every: 1m, options: {exchange: `+exch+`, routing_key: nowhere}}
  noexch:  {task: tasks.add, every: 1m, options: {exchange: `+uniq("missing")+`, routing_key: x}}
  mismatch: {task: tasks.add, every: 1m, options: {queue: `+lazy+`}}
  fine:    {task: tasks.add, every: 1m, options: {queue: `+okq+`}}
`))
	if err != nil {
		t.Fatal(err)
	}
	a := fencedAMQP(t, rb, uniq("unroutable"), cfg)
	ctx := context.Background()
	var fires []celery.Fire
	for _, e := range cfg.Entries {
		task, err := celery.Compile(e.Spec(), "u", "beatd@test", "")
		if err != nil {
			t.Fatal(err)
		}
		fires = append(fires, celery.Fire{Task: task, Slot: time.Unix(60, 0)})
	}
	res := make([]broker.Result, len(fires))
	err = a.Publish(ctx, 1, fires, res)
	if err == nil {
		t.Fatal("no error")
	}
	for i, e := range cfg.Entries {
		want := broker.ResultError
		if e.Name == "fine" {
			want = broker.ResultOK
		} else if !strings.Contains(err.Error(), `entry "`+e.Name+`"`) {
			t.Errorf("the error does not name %s: %v", e.Name, err)
		}
		if res[i] != want {
			t.Errorf("%s: %v, want %v", e.Name, res[i], want)
		}
	}
	for _, frag := range []string{"NO_ROUTE", "does not exist", "PRECONDITION_FAILED"} {
		if !strings.Contains(err.Error(), frag) {
			t.Errorf("error lacks %q: %v", frag, err)
		}
	}
	// The publisher keeps working after those errors.
	for i, e := range cfg.Entries {
		if e.Name == "fine" {
			res = make([]broker.Result, 1)
			if err := a.Publish(ctx, 1, []celery.Fire{{Task: fires[i].Task, Slot: time.Unix(180, 0)}}, res); err != nil || res[0] != broker.ResultOK {
				t.Fatalf("after errors: %v %v", res, err)
			}
		}
	}
}
