package amqp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
)

// drainQueue takes every message out of q and returns their
// beat_fencing_token and task ids.
func drainQueue(t *testing.T, conn *amqp.Connection, q string) (tokens []int64, ids []string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for {
		m, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return tokens, ids
		}
		var tok int64
		switch v := m.Headers["beat_fencing_token"].(type) {
		case int32:
			tok = int64(v)
		case int64:
			tok = v
		}
		tokens = append(tokens, tok)
		ids = append(ids, m.CorrelationId)
	}
}

func fenceEntries(t *testing.T, queue string, n int) []*celery.Task {
	t.Helper()
	y := "entries:\n"
	for i := 0; i < n; i++ {
		y += fmt.Sprintf("  e%d: {task: tasks.add, every: 1m, args: [%d, 1], options: {queue: %s}}\n", i, i, queue)
	}
	cfg, err := config.Parse("fence.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	var out []*celery.Task
	for _, e := range cfg.Entries {
		task, err := celery.Compile(e.Spec(), "fence", "beatd@test", "")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, task)
	}
	return out
}

func firesOf(tasks []*celery.Task, slot time.Time) []celery.Fire {
	out := make([]celery.Fire, len(tasks))
	for i, t := range tasks {
		out[i] = celery.Fire{Task: t, Slot: slot}
	}
	return out
}

// TestAMQPFenceStaleLeaderCannotPublish: leader A (token 1) is cut off
// from the broker, as by SIGSTOP, past the heartbeat timeout. B (token 2)
// waits for the lock, takes it, publishes. A wakes up and publishes: it
// gets ErrStale and nothing of it reaches the queue, on its old connection
// or on a new one.
func TestAMQPFenceStaleLeaderCannotPublish(t *testing.T) {
	rb := sharedRabbit(t)
	queue, cluster := uniq("fenceq"), uniq("fence")
	tasks := fenceEntries(t, queue, 3)
	var term termCheck
	term.current.Store(1)
	proxy := testutil.MustStartProxy(t, fmt.Sprintf("127.0.0.1:%d", rb.Port))
	a, err := NewAMQP(AMQPOptions{URL: fmt.Sprintf("amqp://guest:guest@%s//?heartbeat=1", proxy.Addr()), Cluster: cluster, Verify: term.verify})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewAMQP(AMQPOptions{URL: rb.URL() + "?heartbeat=1", Cluster: cluster, Verify: term.verify})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slot := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := a.RaiseFence(ctx, 1); err != nil {
		t.Fatal(err)
	}
	res := make([]broker.Result, 3)
	if err := a.Publish(ctx, 1, firesOf(tasks, slot), res); err != nil {
		t.Fatal(err)
	}
	// B connects while A leads: the lock is A's, and etcd does not
	// know term 2 yet.
	if err := b.RaiseFence(ctx, 2); !errors.Is(err, broker.ErrStale) {
		t.Fatalf("B fenced before its election: %v", err)
	}
	// A pauses; etcd elects B.
	proxy.Blackhole(true)
	term.current.Store(2)
	// While the broker still holds A's connection, B cannot fence.
	if err := b.RaiseFence(ctx, 2); err == nil || errors.Is(err, broker.ErrStale) {
		t.Fatalf("B fenced while A's connection was alive: %v", err)
	}
	testutil.EventuallyErr(t, 60*time.Second, 100*time.Millisecond, "B to fence", func() error {
		err := b.RaiseFence(ctx, 2)
		if errors.Is(err, broker.ErrStale) {
			t.Fatalf("B could not fence: %v", err)
		}
		return err
	})
	if err := b.Publish(ctx, 2, firesOf(tasks, slot.Add(time.Minute)), res); err != nil {
		t.Fatal(err)
	}
	// A wakes up, still believing it leads with token 1.
	proxy.Blackhole(false)
	for i := 0; i < 3; i++ {
		err := a.Publish(ctx, 1, firesOf(tasks, slot.Add(2*time.Minute)), res)
		if !errors.Is(err, broker.ErrStale) {
			// The first try may only find its connection dead.
			if i == 2 {
				t.Fatalf("A's publish after B fenced: %v %v, want ErrStale", err, res)
			}
			continue
		}
		if res[0] != broker.ResultStale {
			t.Fatalf("results %v", res)
		}
		break
	}
	conn := testutil.DialRabbit(t, rb)
	tokens, _ := drainQueue(t, conn, queue)
	want := []int64{1, 1, 1, 2, 2, 2}
	if fmt.Sprint(tokens) != fmt.Sprint(want) {
		t.Fatalf("tokens in the queue %v, want %v", tokens, want)
	}
}

// TestAMQPFenceReleasedWhenTermEnds: a term that ends closes its
// connection, which frees the lock at once for the next leader.
func TestAMQPFenceReleasedWhenTermEnds(t *testing.T) {
	rb := sharedRabbit(t)
	cluster := uniq("release")
	var term termCheck
	term.current.Store(1)
	a, _ := NewAMQP(AMQPOptions{URL: rb.URL(), Cluster: cluster, Verify: term.verify})
	b, _ := NewAMQP(AMQPOptions{URL: rb.URL(), Cluster: cluster, Verify: term.verify})
	defer a.Close()
	defer b.Close()
	actx, aend := context.WithCancel(context.Background())
	if err := a.RaiseFence(actx, 1); err != nil {
		t.Fatal(err)
	}
	term.current.Store(2)
	aend() // A's term ends: the scheduler's context for it is cancelled
	testutil.EventuallyErr(t, 10*time.Second, 20*time.Millisecond, "B to fence after A's term ended",
		func() error { return b.RaiseFence(context.Background(), 2) })
	// A's ended term can never publish again, even on a new connection.
	res := make([]broker.Result, 1)
	tasks := fenceEntries(t, uniq("relq"), 1)
	if err := a.Publish(context.Background(), 1, firesOf(tasks, time.Now()), res); !errors.Is(err, broker.ErrStale) {
		t.Fatalf("publish of an ended term: %v", err)
	}
}

// TestAMQPJournal: slots an older term's journal records as published are
// not published again; slots of an intent without a done record (a leader
// killed in between) are re-sent and counted.
func TestAMQPJournal(t *testing.T) {
	rb := sharedRabbit(t)
	queue, cluster := uniq("journalq"), uniq("journal")
	tasks := fenceEntries(t, queue, 4)
	slot := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var term termCheck
	ctx := context.Background()
	newTerm := func(token int64) (*AMQP, *prometheus.Registry, context.CancelFunc) {
		term.current.Store(token)
		reg := prometheus.NewRegistry()
		a, err := NewAMQP(AMQPOptions{URL: rb.URL(), Cluster: cluster, Verify: term.verify, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		tctx, end := context.WithCancel(ctx)
		if err := a.RaiseFence(tctx, token); err != nil {
			t.Fatal(err)
		}
		return a, reg, func() { end(); a.Close() }
	}
	// Term 1 publishes e0 and e1, and dies before recording them in etcd.
	a, _, end := newTerm(1)
	res := make([]broker.Result, 2)
	if err := a.Publish(ctx, 1, firesOf(tasks[:2], slot), res); err != nil {
		t.Fatal(err)
	}
	end()
	// A leader killed between its intent record and its messages' done
	// record leaves an intent alone: e2 may or may not be in a queue.
	conn := testutil.DialRabbit(t, rb)
	ch, _ := conn.Channel()
	id2 := tasks[2].SlotID(slot)
	body, _ := json.Marshal(journalRecord{Token: 1, Seq: 99, Kind: "intent", IDs: []string{string(id2[:])}})
	if err := ch.PublishWithContext(ctx, "", "beatd.journal."+cluster, true, false, amqp.Publishing{Body: body, DeliveryMode: amqp.Persistent}); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	// Term 2 re-publishes everything its etcd state does not record.
	b, reg, end := newTerm(2)
	defer end()
	res = make([]broker.Result, 4)
	if err := b.Publish(ctx, 2, firesOf(tasks, slot), res); err != nil {
		t.Fatal(err)
	}
	if want := []broker.Result{broker.ResultDuplicate, broker.ResultDuplicate, broker.ResultOK, broker.ResultOK}; fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("results %v, want %v", res, want)
	}
	if n := promtest.ToFloat64(b.Resends().WithLabelValues("e2")); n != 1 {
		t.Fatalf("resends{e2} = %v, want 1", n)
	}
	if n, _ := promtest.GatherAndCount(reg, "beatd_amqp_resends_total"); n != 1 {
		t.Fatalf("%d resend series, want 1", n)
	}
	if n := promtest.ToFloat64(b.allTerms.WithLabelValues("e2")); n != 1 {
		t.Fatalf("resends of all terms {e2} = %v on term 2, want 1", n)
	}
	// Term 3, on another replica, inherits the count from the journal
	// although it re-sends nothing.
	end()
	c, _, end3 := newTerm(3)
	defer end3()
	if n := promtest.ToFloat64(c.allTerms.WithLabelValues("e2")); n != 1 {
		t.Fatalf("resends of all terms {e2} = %v on term 3, want 1", n)
	}
	if n := promtest.ToFloat64(c.Resends().WithLabelValues("e2")); n != 0 {
		t.Fatalf("term 3 re-sent: %v", n)
	}
	_, ids := drainQueue(t, conn, queue)
	seen := map[string]int{}
	for _, id := range ids {
		seen[id]++
	}
	if len(ids) != 4 || len(seen) != 4 {
		t.Fatalf("queue holds %v", ids)
	}
}
