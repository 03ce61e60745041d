package redis

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
)

var markSlot = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func slotFires(task *celery.Task, secs ...int) []celery.Fire {
	var fs []celery.Fire
	for _, s := range secs {
		fs = append(fs, celery.Fire{Task: task, Slot: markSlot.Add(time.Duration(s) * time.Second)})
	}
	return fs
}

func publishAll(t *testing.T, p *Publisher, token int64, fires []celery.Fire) []broker.Result {
	t.Helper()
	res := make([]broker.Result, len(fires))
	if err := p.Publish(context.Background(), token, fires, res); err != nil {
		t.Fatalf("publish: %v (%v)", err, res)
	}
	return res
}

func equalResults(a []broker.Result, b ...broker.Result) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMarkRefusesAtOrBelow: a slot at or below its entry's high-water
// mark is refused as a duplicate in the same transaction that advances
// the mark for the slot above it; other entries are not affected.
func TestMarkRefusesAtOrBelow(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
	a, b := namedTask(t, "a", "{task: tasks.add, every: 1s}"), namedTask(t, "b", "{task: tasks.add, every: 1s}")
	if res := publishAll(t, p, 1, slotFires(a, 2)); !equalResults(res, broker.ResultOK) {
		t.Fatalf("first: %v", res)
	}
	fires := append(slotFires(a, 1, 2, 3), slotFires(b, 1)...)
	if len(fires) > flightFires {
		t.Fatal("the fires must fit one transaction")
	}
	if res := publishAll(t, p, 1, fires); !equalResults(res, broker.ResultDuplicate, broker.ResultDuplicate, broker.ResultOK, broker.ResultOK) {
		t.Fatalf("below, at and above the mark, and another entry: %v", res)
	}
	if n := client.LLen(context.Background(), "celery").Val(); n != 3 {
		t.Fatalf("queue holds %d messages, want 3", n)
	}
	h, err := p.Histories(context.Background(), []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if h["a"].Count != 2 || h["b"].Count != 1 || len(h["a"].Runs) != 2 {
		t.Fatalf("histories: %+v", h)
	}
}

// TestCallPlanKeepsEntriesTogether: an entry's slots past a flight's
// size stay in one flight and in order, whatever else the batch holds.
func TestCallPlanKeepsEntriesTogether(t *testing.T) {
	t.Parallel()
	var tasks [3]*celery.Task
	for i := range tasks {
		tasks[i] = &celery.Task{Name: "t" + strconv.Itoa(i)}
	}
	var fires []celery.Fire
	for i := range 200 {
		fires = append(fires, celery.Fire{Task: tasks[i%3], Slot: markSlot.Add(time.Duration(i) * time.Second)})
	}
	order, cuts := callPlan(fires)
	if len(order) != len(fires) || cuts[len(cuts)-1] != len(fires) {
		t.Fatalf("plan covers %d of %d fires", len(order), len(fires))
	}
	lo := 0
	where := map[*celery.Task]int{}
	for c, hi := range cuts {
		last := map[*celery.Task]time.Time{}
		for _, i := range order[lo:hi] {
			f := fires[i]
			if w, ok := where[f.Task]; ok && w != c {
				t.Fatalf("%s spans calls %d and %d", f.Task.Name, w, c)
			}
			where[f.Task] = c
			if !f.Slot.After(last[f.Task]) {
				t.Fatalf("%s out of order in call %d", f.Task.Name, c)
			}
			last[f.Task] = f.Slot
		}
		lo = hi
	}
	// Distinct entries keep their order, in flights of flightFires.
	distinct := make([]celery.Fire, 2*flightFires+2)
	for i := range distinct {
		distinct[i] = celery.Fire{Task: &celery.Task{Name: strconv.Itoa(i)}}
	}
	order, cuts = callPlan(distinct)
	if len(cuts) != 3 || cuts[0] != flightFires || order[77] != 77 {
		t.Fatalf("distinct entries: cuts %v", cuts)
	}
}

// TestBacklogRepublishedAfterFailover: a leader publishes slots 1-5 but
// its etcd state says only 1-2; the next leader (a larger token) owes and
// re-publishes 3-7. The marks make 3-5 duplicates: every slot is in the
// queue exactly once, and the deposed leader is refused.
func TestBacklogRepublishedAfterFailover(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	opts := Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"}
	old, next := New(client, opts), New(client, opts)
	task := namedTask(t, "e", "{task: tasks.add, every: 1s}")
	if err := old.RaiseFence(ctx, 10); err != nil {
		t.Fatal(err)
	}
	publishAll(t, old, 10, slotFires(task, 1, 2, 3, 4, 5))
	if err := next.RaiseFence(ctx, 11); err != nil {
		t.Fatal(err)
	}
	res := publishAll(t, next, 11, slotFires(task, 3, 4, 5, 6, 7))
	if !equalResults(res, broker.ResultDuplicate, broker.ResultDuplicate, broker.ResultDuplicate, broker.ResultOK, broker.ResultOK) {
		t.Fatalf("re-publish of the backlog: %v", res)
	}
	stale := make([]broker.Result, 1)
	if err := old.Publish(ctx, 10, slotFires(task, 8), stale); !errors.Is(err, broker.ErrStale) {
		t.Fatalf("deposed leader: %v %v", stale, err)
	}
	if n := client.LLen(ctx, "celery").Val(); n != 7 {
		t.Fatalf("queue holds %d messages, want slots 1-7 once each", n)
	}
}

// TestTriggerIdempotent: a manual fire is deduplicated by its request id
// for TriggerTTL, with a task id derived from it, and moves no mark.
func TestTriggerIdempotent(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", TriggerTTL: time.Hour})
	task := namedTask(t, "e", "{task: tasks.add, every: 1s}")
	now := markSlot.Add(time.Hour)
	f1 := celery.Fire{Task: task, Slot: now, Manual: true, Request: "req-1"}
	f2 := celery.Fire{Task: task, Slot: now.Add(time.Second), Manual: true, Request: "req-1"} // a new leader, later
	if res := publishAll(t, p, 1, []celery.Fire{f1}); !equalResults(res, broker.ResultOK) {
		t.Fatalf("trigger: %v", res)
	}
	res := make([]broker.Result, 1)
	fs := []celery.Fire{f2}
	if err := p.Publish(ctx, 2, fs, res); err != nil || res[0] != broker.ResultDuplicate {
		t.Fatalf("the same request again: %v %v", res, err)
	}
	if ttl := client.PTTL(ctx, p.TriggerKey("req-1")).Val(); ttl < 59*time.Minute || ttl > time.Hour {
		t.Fatalf("trigger key TTL %v, want about 1h", ttl)
	}
	other := celery.Fire{Task: task, Slot: now, Manual: true, Request: "req-2"}
	again := []celery.Fire{other}
	publishAll(t, p, 2, again)
	if again[0].ID == fs[0].ID {
		t.Fatal("two requests got one task id")
	}
	// The trigger did not move the mark: the next scheduled slot, before
	// the trigger's time, still goes out.
	if res := publishAll(t, p, 2, slotFires(task, 1)); !equalResults(res, broker.ResultOK) {
		t.Fatalf("scheduled slot after triggers: %v", res)
	}
	if h, _ := p.Histories(ctx, []string{"e"}); h["e"].Count != 3 {
		t.Fatalf("run count %d, want 3", h["e"].Count)
	}
}

// TestUpgradeHonoursLegacyDedupKeys seeds Redis as the previous release
// leaves it (a fence, per-fire dedup keys, the run count hash) and starts
// this release's leader on it: the old keys are honoured, this release
// writes them too while the legacy window lasts (so an old replica that
// leads again skips its slots), and the count carries on.
func TestUpgradeHonoursLegacyDedupKeys(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", DedupTTL: 2 * time.Hour})
	task := namedTask(t, "e", "{task: tasks.add, every: 1s}")
	// The previous release led with token 5 and published slots 1 and 2.
	client.Set(ctx, p.fenceKey, "5", 0)
	for _, s := range []int{1, 2} {
		client.Set(ctx, p.DedupKey(task.SlotID(markSlot.Add(time.Duration(s)*time.Second))), "5", time.Hour)
	}
	client.HSet(ctx, p.countsKey(), "e", 7)
	if err := p.RaiseFence(ctx, 6); err != nil {
		t.Fatal(err)
	}
	if ttl := client.PTTL(ctx, p.legacyKey()).Val(); ttl < time.Hour || ttl > 2*time.Hour {
		t.Fatalf("legacy window %v, want the dedup TTL (2h)", ttl)
	}
	// Its state in etcd said slot 0: the new leader re-publishes 1-3.
	res := publishAll(t, p, 6, slotFires(task, 1, 2, 3))
	if !equalResults(res, broker.ResultDuplicate, broker.ResultDuplicate, broker.ResultOK) {
		t.Fatalf("after the upgrade: %v", res)
	}
	s3 := task.SlotID(markSlot.Add(3 * time.Second))
	if client.Exists(ctx, p.DedupKey(s3)).Val() != 1 {
		t.Fatal("in the legacy window, a published slot has no old-format key: an old replica would repeat it")
	}
	if h, _ := p.Histories(ctx, []string{"e"}); h["e"].Count != 8 {
		t.Fatalf("run count %d, want the old 7 + 1", h["e"].Count)
	}
	// An old replica leads again (token 7) and publishes slot 4; this
	// release takes over with 8: the window is opened again, and slot 4,
	// which its mark does not know, is a duplicate by its old key.
	client.Del(ctx, p.legacyKey())
	client.Set(ctx, p.fenceKey, "7", 0)
	s4 := task.SlotID(markSlot.Add(4 * time.Second))
	client.Set(ctx, p.DedupKey(s4), "7", time.Hour)
	if err := p.RaiseFence(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if client.Exists(ctx, p.legacyKey()).Val() != 1 {
		t.Fatal("an old release's term did not reopen the legacy window")
	}
	if res := publishAll(t, p, 8, slotFires(task, 4, 5)); !equalResults(res, broker.ResultDuplicate, broker.ResultOK) {
		t.Fatalf("after an old replica's term: %v", res)
	}
	if n := client.LLen(ctx, "celery").Val(); n != 2 {
		t.Fatalf("this release pushed %d messages, want 2 (slots 3 and 5)", n)
	}
	// Once every term is this release's and the window has passed, no
	// fire writes or reads an old-format key.
	client.Del(ctx, p.legacyKey())
	if err := p.RaiseFence(ctx, 9); err != nil {
		t.Fatal(err)
	}
	publishAll(t, p, 9, slotFires(task, 6))
	if client.Exists(ctx, p.legacyKey(), p.DedupKey(task.SlotID(markSlot.Add(6*time.Second)))).Val() != 0 {
		t.Fatal("after the window: a legacy flag or key was written")
	}
}

// TestFreshInstallHasNoLegacyWindow: with no previous release, no flag.
func TestFreshInstallHasNoLegacyWindow(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
	if err := p.RaiseFence(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if client.Exists(context.Background(), p.legacyKey()).Val() != 0 {
		t.Fatal("a fresh install opened a legacy window")
	}
}

// TestForget: an entry gone for good leaves nothing in Redis; a deposed
// leader cannot forget.
func TestForget(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
	gone, kept := namedTask(t, "gone", "{task: tasks.add, every: 1s}"), namedTask(t, "kept", "{task: tasks.add, every: 1s}")
	publishAll(t, p, 3, append(slotFires(gone, 1), slotFires(kept, 1)...))
	if err := p.Forget(ctx, 2, []string{"gone"}); !errors.Is(err, broker.ErrStale) {
		t.Fatalf("stale forget: %v", err)
	}
	if err := p.Forget(ctx, 3, []string{"gone"}); err != nil {
		t.Fatal(err)
	}
	if client.HExists(ctx, p.entriesKey(), "gone").Val() || client.Exists(ctx, p.historyKey("gone")).Val() != 0 {
		t.Fatal("forgotten entry left keys")
	}
	f, err := p.Footprint(ctx)
	if err != nil || f.Entries != 1 || f.Keys != 4 {
		t.Fatalf("footprint %+v %v, want 1 entry, 4 keys", f, err)
	}
	if keys := client.Keys(ctx, "beatd:{test}:*").Val(); len(keys) != int(f.Keys) {
		t.Fatalf("footprint counts %d keys, Redis has %v", f.Keys, keys)
	}
}

// TestFootprintWithRedisDown: a scrape while Redis is down is not an
// error (it would fail all of /metrics); the footprint is just absent.
func TestFootprintWithRedisDown(t *testing.T) {
	t.Parallel()
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(c, Options{KeyPrefix: "beatd:{test}:"}).FootprintCollector())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 0 {
		t.Fatalf("gather with Redis down: %v, %d families", err, len(mfs))
	}
}
