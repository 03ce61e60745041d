package redis

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// receiveSent is Celery's own event receiver (what Flower and `celery
// events` use) waiting for one task-sent event and printing it as Celery's
// State recorded the task.
const receiveSent = `
import json, sys
from celery import Celery
app = Celery(broker=sys.argv[1])
state = app.events.State()
with app.connection() as conn:
    def on_sent(event):
        state.event(event)
        task = state.tasks.get(event["uuid"])
        print(json.dumps({"uuid": task.uuid, "name": task.name, "state": task.state, "args": task.args,
                          "routing_key": task.routing_key, "hostname": event["hostname"],
                          "sent": "yes" if task.sent else "no"}), flush=True)
        raise SystemExit(0)
    print("listening", flush=True)
    app.events.Receiver(conn, handlers={"task-sent": on_sent}).capture(limit=None, timeout=20)
`

// TestSentEventsReadByCelery: with SentEventsFrom, each new message has a
// task-sent event that Celery's event receiver reads into its State: a
// task sent (Celery's state for it is PENDING until a worker receives it).
func TestSentEventsReadByCelery(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	cmd := exec.Command(testutil.CeleryPython, "-c", receiveSent, rs.URL(0))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	testutil.Eventually(t, 20*time.Second, "Celery's receiver subscribed", func() bool {
		n, _ := client.Do(ctx, "PUBSUB", "NUMPAT").Int()
		m, _ := client.PubSubChannels(ctx, "*celeryev*").Result()
		return n > 0 || len(m) > 0
	})

	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", SentEventsFrom: "beatd@test"})
	task := compileTest(t, "    {task: tasks.add, every: 1s, args: [1, 2]}")
	if err := p.RaiseFence(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fires := []celery.Fire{{Task: task, Slot: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}}
	res := make([]broker.Result, 1)
	if err := p.Publish(ctx, 1, fires, res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("publish: %v %v", res, err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("receiver: %v\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Celery's receiver saw no task-sent event:\n%s", out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var got map[string]string
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	want := map[string]string{"uuid": string(fires[0].ID[:]), "name": "tasks.add", "state": "PENDING", "sent": "yes", "args": "[1, 2]", "routing_key": "celery", "hostname": "beatd@test"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("Celery's state: %s = %q, want %q", k, got[k], v)
		}
	}
}
