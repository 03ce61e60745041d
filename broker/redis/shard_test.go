package redis

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestShardFences: each shard of a sharded cluster has its own fence. A
// newer leader of shard 1 deposes shard 1's old leader and nobody else;
// the unsharded publisher's keys are today's (no suffix).
func TestShardFences(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	opts := func(shard string) Options {
		return Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", Shard: shard}
	}
	s0, s1 := New(client, opts("0")), New(client, opts("1"))
	one := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{one}:"})
	if s0.fenceKey != "beatd:{test}:fence:0" || s1.slotsTermKey() != "beatd:{test}:slots-term:1" ||
		one.fenceKey != "beatd:{one}:fence" || one.slotsTermKey() != "beatd:{one}:slots-term" {
		t.Fatalf("fence keys %q %q %q %q", s0.fenceKey, s1.slotsTermKey(), one.fenceKey, one.slotsTermKey())
	}
	a := compileTest(t, "    {task: tasks.add, every: 1s, args: [1]}")
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	res := make([]broker.Result, 1)
	for _, tc := range []struct {
		name  string
		p     *Publisher
		token int64
	}{{"shard 0 elected at 20", s0, 20}, {"shard 1 elected at 30", s1, 30}} {
		if err := tc.p.RaiseFence(ctx, tc.token); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	// Shard 0's token is below shard 1's fence, and that is no concern of
	// shard 0's.
	if err := s0.Publish(ctx, 20, []celery.Fire{{Task: a, Slot: slot}}, res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("shard 0 under a higher shard 1 fence: %v %v", res[0], err)
	}
	// A new leader of shard 1 (token 40) deposes the one of token 30 ...
	if err := s1.RaiseFence(ctx, 40); err != nil {
		t.Fatal(err)
	}
	b := compileTest(t, "    {task: tasks.add, every: 1s, args: [2]}")
	if err := s1.Publish(ctx, 30, []celery.Fire{{Task: b, Slot: slot}}, res); !errors.Is(err, broker.ErrStale) || res[0] != broker.ResultStale {
		t.Fatalf("deposed shard 1 leader: %v %v", res[0], err)
	}
	// ... and shard 0's leader of token 20 still publishes.
	if err := s0.Publish(ctx, 20, []celery.Fire{{Task: a, Slot: slot.Add(time.Second)}}, res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("shard 0 after shard 1's new term: %v %v", res[0], err)
	}
	if n := client.LLen(ctx, "celery").Val(); n != 2 {
		t.Fatalf("queue has %d messages, want 2", n)
	}
	got := client.Keys(ctx, "beatd:{test}:*").Val()
	slices.Sort(got)
	want := []string{"beatd:{test}:entries", "beatd:{test}:fence:0", "beatd:{test}:fence:1", "beatd:{test}:runs:e",
		"beatd:{test}:slots-term:0", "beatd:{test}:slots-term:1"}
	if !slices.Equal(got, want) {
		t.Errorf("keys = %v, want %v", got, want)
	}
}

// TestRaiseShardFences: a resize raises every fence of both counts to its
// floor, so a leader of the old count that wakes after it (its entries'
// marks cached for its term) is refused; a fence already above the floor
// stays, and the new count's leaders, elected after the floor, publish.
func TestRaiseShardFences(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	const prefix = "beatd:{rsz}:"
	shard := func(s string) *Publisher {
		return New(client, Options{Cluster: "beatd/rsz", KeyPrefix: prefix, Shard: s})
	}
	a := compileTest(t, "    {task: tasks.add, every: 1s, args: [3]}")
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	res := make([]broker.Result, 1)
	// Shards of 2 elected at 10 and 12; shard 1's fence was raised to 300
	// by a later term already.
	old0, old1 := shard("0"), shard("1")
	for p, tok := range map[*Publisher]int64{old0: 10, old1: 300} {
		if err := p.RaiseFence(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := old0.Publish(ctx, 10, []celery.Fire{{Task: a, Slot: slot}}, res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("old shard 0 before the resize: %v %v", res[0], err)
	}
	if err := RaiseShardFences(ctx, client, prefix, []int{2, 4}, 100); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want int64
	}{{"fence:0", 100}, {"fence:1", 300}, {"fence:2", 100}, {"fence:3", 100}} {
		if got, err := client.Get(ctx, prefix+tc.key).Int64(); err != nil || got != tc.want {
			t.Errorf("%s = %d (%v), want %d", tc.key, got, err, tc.want)
		}
	}
	if n, _ := client.Exists(ctx, prefix+"fence").Result(); n != 0 {
		t.Error("a resize from 2 to 4 shards raised the unsharded fence")
	}
	// The old shard 0 leader wakes: refused, though its own shard is not
	// led yet.
	if err := old0.Publish(ctx, 10, []celery.Fire{{Task: a, Slot: slot.Add(time.Second)}}, res); !errors.Is(err, broker.ErrStale) || res[0] != broker.ResultStale {
		t.Fatalf("old shard 0 after the resize: %v %v, want stale", res[0], err)
	}
	// A leader of the new count (elected after the floor) publishes.
	new3 := shard("3")
	if err := new3.RaiseFence(ctx, 120); err != nil {
		t.Fatal(err)
	}
	if err := new3.Publish(ctx, 120, []celery.Fire{{Task: a, Slot: slot.Add(time.Second)}}, res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("new shard 3: %v %v", res[0], err)
	}
	// 1 shard is the unsharded fence.
	if err := RaiseShardFences(ctx, client, prefix, []int{4, 1}, 200); err != nil {
		t.Fatal(err)
	}
	if got, _ := client.Get(ctx, prefix+"fence").Int64(); got != 200 {
		t.Errorf("unsharded fence = %d after a resize to 1, want 200", got)
	}
}
