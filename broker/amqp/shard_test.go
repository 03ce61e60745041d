package amqp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestAMQPShardFences: each shard of a sharded cluster has its own fence
// lock and journal. Two shards' leaders hold their locks at once; a new
// leader of shard 1 fences once the old one's term ends, the old one is
// refused, and shard 0's leader publishes on, unaffected.
func TestAMQPShardFences(t *testing.T) {
	rb := sharedRabbit(t)
	queue, cluster := uniq("shardq"), uniq("shard")
	tasks := fenceEntries(t, queue, 2)
	var term0, term1 termCheck
	term0.current.Store(1)
	term1.current.Store(2)
	open := func(shard string, tc *termCheck) *AMQP {
		a, err := NewAMQP(AMQPOptions{URL: rb.URL(), Cluster: cluster, Shard: shard, Verify: tc.verify})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	if got := open("3", &term0).lockName; got != "beatd.fence."+cluster+".3" {
		t.Fatalf("shard 3's lock is %q", got)
	}
	if got := open("", &term0).lockName; got != "beatd.fence."+cluster {
		t.Fatalf("one shard's lock is %q, want today's", got)
	}
	ctx := context.Background()
	s0, s1 := open("0", &term0), open("1", &term1)
	if err := s0.RaiseFence(ctx, 1); err != nil {
		t.Fatal(err)
	}
	s1ctx, s1end := context.WithCancel(ctx)
	if err := s1.RaiseFence(s1ctx, 2); err != nil {
		t.Fatalf("shard 1 could not fence while shard 0's leader holds its lock: %v", err)
	}
	slot := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	res := make([]broker.Result, 1)
	if err := s0.Publish(ctx, 1, firesOf(tasks[:1], slot), res); err != nil {
		t.Fatal(err)
	}
	if err := s1.Publish(ctx, 2, firesOf(tasks[1:], slot), res); err != nil {
		t.Fatal(err)
	}
	// Shard 1 elects a new leader (token 3); the old term ends.
	term1.current.Store(3)
	s1new := open("1", &term1)
	s1end()
	testutil.EventuallyErr(t, 10*time.Second, 20*time.Millisecond, "shard 1's new leader to fence",
		func() error { return s1new.RaiseFence(ctx, 3) })
	if err := s1.Publish(ctx, 2, firesOf(tasks[1:], slot.Add(time.Minute)), res); !errors.Is(err, broker.ErrStale) {
		t.Fatalf("shard 1's deposed leader: %v, want ErrStale", err)
	}
	if err := s0.Publish(ctx, 1, firesOf(tasks[:1], slot.Add(time.Minute)), res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("shard 0 after shard 1's new term: %v %v", res[0], err)
	}
	if err := s1new.Publish(ctx, 3, firesOf(tasks[1:], slot.Add(time.Minute)), res); err != nil {
		t.Fatal(err)
	}
	conn := testutil.DialRabbit(t, rb)
	tokens, _ := drainQueue(t, conn, queue)
	if want := []int64{1, 2, 1, 3}; fmt.Sprint(tokens) != fmt.Sprint(want) {
		t.Fatalf("tokens in the queue %v, want %v", tokens, want)
	}
}

// TestCheckResizable: a resize refuses while a connection holds a fence
// lock of either count (a replica of the old count paused with its
// connection open), and while an old shard's journal ends in a term that
// did not record its clean end (its state may lack a batch the journal
// records), naming each; a term that closed cleanly, or a shard that never
// published, passes, and the check lets go of every lock it took.
func TestCheckResizable(t *testing.T) {
	rb := sharedRabbit(t)
	ctx := context.Background()
	queue, cluster := uniq("rszq"), uniq("rsz")
	tasks := fenceEntries(t, queue, 1)
	var term termCheck
	term.current.Store(5)
	open := func(shard string) *AMQP {
		a, err := NewAMQP(AMQPOptions{URL: rb.URL(), Cluster: cluster, Shard: shard, Verify: term.verify})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	old := open("1")
	termCtx, endTerm := context.WithCancel(ctx)
	if err := old.RaiseFence(termCtx, 5); err != nil {
		t.Fatal(err)
	}
	res := make([]broker.Result, 1)
	if err := old.Publish(ctx, 5, firesOf(tasks, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("publish: %v %v", res[0], err)
	}
	err := CheckResizable(rb.URL(), "", cluster, 2, 4)
	if err == nil || !strings.Contains(err.Error(), "beatd.fence."+cluster+".1 is held") {
		t.Fatalf("check with shard 1's lock held: %v, want it named", err)
	}
	endTerm() // the term ends, its connection (and lock) with it
	testutil.EventuallyErr(t, 10*time.Second, 20*time.Millisecond, "the lock to be free", func() error {
		err := CheckResizable(rb.URL(), "", cluster, 2, 4)
		if err != nil && strings.Contains(err.Error(), "is held") {
			return err
		}
		return nil
	})
	err = CheckResizable(rb.URL(), "", cluster, 2, 4)
	if err == nil || !strings.Contains(err.Error(), "shard 1's last term (token 5) ended without writing its state") {
		t.Fatalf("check after a term that did not close: %v, want shard 1 named", err)
	}
	// A later term that never fenced (so never read the journal) settled
	// nothing: its end changes nothing.
	if err := open("1").CloseTerm(ctx, 6); err != nil {
		t.Fatal(err)
	}
	if err := CheckResizable(rb.URL(), "", cluster, 2, 4); err == nil || !strings.Contains(err.Error(), "token 5") {
		t.Fatalf("check after a term that never fenced ended: %v, want shard 1's term 5 still named", err)
	}
	if err := old.CloseTerm(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if err := CheckResizable(rb.URL(), "", cluster, 2, 4); err != nil {
		t.Fatalf("check after the term closed: %v", err)
	}
	// The closed record is no batch: the shard's next term reads the
	// journal as before and publishes.
	term.current.Store(9)
	next := open("1")
	if err := next.RaiseFence(ctx, 9); err != nil {
		t.Fatalf("the shard's next leader after the check: %v", err)
	}
	if err := next.Publish(ctx, 9, firesOf(tasks, time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)), res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("next term's publish: %v %v", res[0], err)
	}
}
