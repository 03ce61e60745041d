package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// TestShardsShareScratch: the Publishers of a replica's shards share one
// Scratch, publishing at once. Every message still carries its own
// entry's args and task id (a plan reused while another publish still
// read it would mix them), and the Scratch keeps no more plans than its
// bound.
func TestShardsShareScratch(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	scratch := &Scratch{max: 1}
	const shards, publishes, batch = 4, 20, 6
	var wg sync.WaitGroup
	errs := make(chan error, shards)
	want := map[string]int{} // argsrepr -> messages
	for s := range shards {
		p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", Shard: strconv.Itoa(s), Scratch: scratch})
		if err := p.RaiseFence(ctx, 1); err != nil {
			t.Fatal(err)
		}
		// Args of distinct lengths, so a mixed-up span shows.
		task := namedTask(t, "e"+strconv.Itoa(s), fmt.Sprintf("{task: tasks.add, every: 1s, args: [%q]}", strings.Repeat("x", 10*(s+1))))
		want[fmt.Sprintf("['%s']", strings.Repeat("x", 10*(s+1)))] = publishes * batch
		wg.Go(func() {
			res := make([]broker.Result, batch)
			for k := range publishes {
				secs := make([]int, batch)
				for i := range secs {
					secs[i] = k*batch + i
				}
				if err := p.Publish(ctx, 1, slotFires(task, secs...), res); err != nil {
					errs <- fmt.Errorf("shard %d: %w", s, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := map[string]int{}
	ids := map[string]bool{}
	for _, raw := range client.LRange(ctx, "celery", 0, -1).Val() {
		var msg struct {
			Headers struct {
				ID       string `json:"id"`
				ArgsRepr string `json:"argsrepr"`
			} `json:"headers"`
			Body []byte `json:"body"` // base64, as Kombu writes it
		}
		var body [3]json.RawMessage // args, kwargs, embed
		var args []string
		if err := json.Unmarshal([]byte(raw), &msg); err != nil {
			t.Fatalf("message %q: %v", raw, err)
		}
		if err := json.Unmarshal(msg.Body, &body); err != nil {
			t.Fatalf("body %q: %v", msg.Body, err)
		}
		if err := json.Unmarshal(body[0], &args); err != nil || fmt.Sprintf("['%s']", args[0]) != msg.Headers.ArgsRepr {
			t.Fatalf("body args %s (%v) disagree with argsrepr %s", body[0], err, msg.Headers.ArgsRepr)
		}
		got[msg.Headers.ArgsRepr]++
		ids[msg.Headers.ID] = true
	}
	if !maps.Equal(got, want) {
		t.Errorf("messages by args = %v, want %v", got, want)
	}
	if len(ids) != shards*publishes*batch {
		t.Errorf("%d distinct task ids, want %d", len(ids), shards*publishes*batch)
	}
	if n := len(scratch.free); n != 1 {
		t.Errorf("scratch keeps %d plans, want its bound 1", n)
	}
}

// TestScratchKeeps: a Scratch keeps up to its bound of plans, and never
// one of a publish larger than planMax, whose buffers would stay that
// large.
func TestScratchKeeps(t *testing.T) {
	plans := func(sizes ...int) []*plan {
		var out []*plan
		for _, n := range sizes {
			out = append(out, &plan{order: make([]int, n)})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		max  int
		put  []*plan
		kept int
	}{
		{"under the bound", 2, plans(10), 1},
		{"at the bound", 2, plans(10, 20, 30), 2},
		{"a large publish's", 2, plans(planMax + 1), 0},
		{"planMax itself", 1, plans(planMax), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Scratch{max: tc.max}
			for _, pl := range tc.put {
				s.put(pl)
			}
			if len(s.free) != tc.kept {
				t.Fatalf("kept %d plans, want %d", len(s.free), tc.kept)
			}
			for range tc.kept {
				if pl := s.get(); !slices.Contains(tc.put, pl) {
					t.Fatal("get made a new plan while one was kept")
				}
			}
			if s.get() == nil || len(s.free) != 0 {
				t.Fatal("an empty Scratch did not make a new plan")
			}
		})
	}
}
