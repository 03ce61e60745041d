package livetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestShardOutcomesAMQP is TestShardOutcomes (daemon) on RabbitMQ: two
// replicas at --shards 4, a real Celery worker (-E, a 4-thread pool)
// whose task events come on the celeryev topic exchange. Each replica's
// one events consumer feeds its shards' loops, so every entry, in every
// shard, records a succeeded run; boom (tasks.fail) is paused after 2
// failures with its exception; and skipper's runs (overlap: skip, 1.6 s
// tasks every 1 s) never overlap by the worker's own clock, while the same
// task without a policy does.
func TestShardOutcomesAMQP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, RabbitMQ, a Celery worker and two beatd processes")
	}
	rb := sharedRabbit(t)
	rs := testutil.MustStartRedis(t) // the worker's result backend, where the executions are read
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Events: true, Pool: "prefork", Concurrency: 4,
		Name: "shards-rabbit@%h", Env: []string{"BROKER_URL=" + rb.URL()}})
	const shards = 4
	var y strings.Builder
	y.WriteString("entries:\n")
	var oks []string
	covered := map[int]bool{}
	for i := 0; len(covered) < shards || len(oks) < 6; i++ {
		name := fmt.Sprintf("ok-%d", i)
		oks, covered[keys.ShardOf(name, shards)] = append(oks, name), true
		fmt.Fprintf(&y, "  %s: {task: tasks.add, every: 1s, args: [1, 2]}\n", name)
	}
	y.WriteString("  boom: {task: tasks.fail, every: 1s, pause_after_failures: 2}\n")
	// Tags of this run alone: the RabbitMQ node is the package's, and an
	// earlier run's (-count) unconsumed sleeps would run here.
	skipTag, allowTag := fmt.Sprintf("shard-amqp-skip-%d", time.Now().UnixNano()), fmt.Sprintf("shard-amqp-allow-%d", time.Now().UnixNano())
	fmt.Fprintf(&y, "  skipper: {task: tasks.sleep, every: 1s, args: [1.6, %s], overlap: skip}\n", skipTag)
	fmt.Fprintf(&y, "  allowed: {task: tasks.sleep, every: 1s, args: [1.6, %s]}\n", allowTag)
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", y.String())
	start := func(id string) *proc {
		p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/shard-outcomes/",
			"--broker", rb.URL(), "--lease-ttl", "2s", "--state-interval", "200ms", "--id", id, "--shards", "4")
		p.ID = id
		return p
	}
	a, b := start("a"), start("b")
	waitFor(t, 30*time.Second, "a and b leading 2 shards each", func() bool {
		return chaos.ShardsBalanced(shardLeaders(t, []*proc{a, b}, shards), shards, []string{"a", "b"})
	})
	waitFor(t, 60*time.Second, "every shard's outcomes: succeeded, paused, skipped", func() bool {
		st := a.status(t)
		for _, name := range oks {
			if e, _ := entryOf(st, name); !hasOutcome(e, "succeeded") {
				return false
			}
		}
		boom, _ := entryOf(st, "boom")
		skipper, _ := entryOf(st, "skipper")
		return boom.Paused && hasOutcome(skipper, "skipped") && hasOutcome(skipper, "succeeded") &&
			len(executions(t, rs, skipTag)) >= 3 && overlaps(executions(t, rs, allowTag))
	})
	boom, _ := entryOf(a.status(t), "boom")
	if !strings.Contains(boom.PauseReason, "ZeroDivisionError") {
		t.Errorf("boom paused for %q, want its exception", boom.PauseReason)
	}
	skips := executions(t, rs, skipTag)
	assertNoOverlap(t, "skipper", skips)
	leaders := shardLeaders(t, []*proc{a, b}, shards)
	t.Logf("%d entries over %d shards (leaders %v): every one's outcomes seen over RabbitMQ; boom paused; skipper ran %d times without overlap",
		len(oks)+3, shards, leaders, len(skips))
}

// overlaps says whether two of the executions ran at the same time.
func overlaps(ex []execution) bool {
	for i := 1; i < len(ex); i++ {
		if ex[i].start < ex[i-1].end {
			return true
		}
	}
	return false
}
