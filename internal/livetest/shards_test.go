package livetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// shardSchedule is entries tenant-00 … firing every second, each owed
// every slot (catchup: all), so the audit can ask for every one.
func shardSchedule(n int, queue string) string {
	var y strings.Builder
	y.WriteString("entries:\n")
	for i := range n {
		fmt.Fprintf(&y, "  tenant-%02d: {task: tasks.t, every: 1s, catchup: all, args: [%d], options: {queue: %s}}\n", i, i, queue)
	}
	return y.String()
}

// shardLeaders is who leads each shard, as any replica's /status says
// (nil until every shard has a leader).
func shardLeaders(t *testing.T, via []*proc, shards int) map[int]string {
	for _, p := range via {
		if !p.Running() {
			continue
		}
		st := p.status(t)
		if len(st.Shards) != shards {
			continue
		}
		out := map[int]string{}
		for _, s := range st.Shards {
			if s.LeaderID == "" {
				return nil
			}
			out[s.Shard] = s.LeaderID
		}
		return out
	}
	return nil
}

// TestShardedReplicas runs `beatd run --shards 8` as processes on real
// etcd and Redis: three replicas share the shards; one is killed (kill
// -9) and the others take its shards after the lease TTL; a fourth joins
// and takes its share by handover; one is stopped (SIGTERM) and hands its
// shards over. Every slot of every entry across all of it is in the queue
// exactly once. A replica started with another shard count, or with
// --shards 0, refuses to start and changes nothing.
func TestShardedReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, Redis and four beatd processes for ~15 s")
	}
	rs := testutil.MustStartRedis(t)
	runShardScenario(t, 8, rs.URL(0), true, func() []chaos.Message {
		msgs, err := chaos.ReadQueue(context.Background(), rs.Client(), "shardq")
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	})
}

// TestShardedReplicasAMQP is the same on RabbitMQ, each shard fenced by its
// own lock and journal, without the kill -9 (which on RabbitMQ may re-send
// a batch unconfirmed at the kill: docs/brokers.md#rabbitmq).
func TestShardedReplicasAMQP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, RabbitMQ and three beatd processes for ~15 s")
	}
	rb := sharedRabbit(t)
	runShardScenario(t, 4, rb.URL(), false, func() []chaos.Message {
		msgs, err := chaos.ReadQueueAMQP(testutil.DialRabbit(t, rb), "shardq")
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	})
}

func runShardScenario(t *testing.T, shards int, brokerURL string, kill bool, read func() []chaos.Message) {
	const entries = 24
	count := strconv.Itoa(shards)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	dir := t.TempDir()
	cfgPath := writeFile(t, dir, "schedules.yaml", shardSchedule(entries, "shardq"))
	cfg, err := config.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "/beatd/sharded/"
	common := []string{"--config", cfgPath, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", prefix,
		"--broker", brokerURL, "--lease-ttl", "2s", "--state-interval", "1s", "--log-fires", "0"}
	start := func(id string, extra ...string) *proc {
		p := startBeatd(t, nil, append(append(slices.Clone(common), "--id", id), extra...)...)
		p.ID = id
		return p
	}
	reps := map[string]*proc{}
	first := []string{"a", "b", "c"}
	if !kill {
		first = []string{"a", "c"}
	}
	for _, id := range first {
		reps[id] = start(id, "--shards", count)
	}
	all := func() []*proc {
		var ps []*proc
		for _, id := range []string{"a", "b", "c", "d"} {
			if p := reps[id]; p != nil {
				ps = append(ps, p)
			}
		}
		return ps
	}
	waitBalanced := func(what string, live ...string) time.Duration {
		t.Helper()
		began := time.Now()
		waitFor(t, 20*time.Second, what, func() bool { return chaos.ShardsBalanced(shardLeaders(t, all(), shards), shards, live) })
		took := time.Since(began)
		t.Logf("%s: %v after %s", what, shardLeaders(t, all(), shards), took.Round(10*time.Millisecond))
		return took
	}
	waitBalanced(fmt.Sprintf("%d replicas balanced", len(first)), first...)
	from := time.Now().Truncate(time.Second).Add(time.Second)

	// Bad input: each refuses to start and writes nothing.
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, tc := range []struct {
		name, shards, want string
	}{
		{name: "another count", shards: "2", want: "--shards 2, but the cluster at /beatd/sharded/ was made with " + count + " shards"},
		{name: "zero", shards: "0", want: "--shards must be 1 or more, not 0"},
		{name: "negative", shards: "-3", want: "--shards must be 1 or more, not -3"},
		{name: "the default, 1", shards: "1", want: "--shards 1, but the cluster at /beatd/sharded/ was made with " + count + " shards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startBeatd(t, nil, append(slices.Clone(common), "--id", "bad", "--shards", tc.shards)...)
			if !p.Wait(30 * time.Second) {
				t.Fatalf("beatd --shards %s did not exit", tc.shards)
			}
			if p.ExitCode() == 0 || !strings.Contains(p.output(), tc.want) {
				t.Fatalf("beatd --shards %s exited %d, want an error saying %q:\n%s", tc.shards, p.ExitCode(), tc.want, tail(p.output(), 10))
			}
		})
	}
	if kvs := etcdValues(t, cli, prefix); kvs[prefix+"shard-count"] != count || slices.Contains(slices.Collect(maps.Values(kvs)), "bad") {
		t.Errorf("a refused replica changed etcd: shard count %q, its id among the values: %v",
			kvs[prefix+"shard-count"], slices.Contains(slices.Collect(maps.Values(kvs)), "bad"))
	}

	time.Sleep(2 * time.Second) // slots under the first balance
	live := []string{"a", "c"}
	if kill {
		// kill -9: the others take c's shards once its leases expire.
		reps["c"].Kill()
		live = []string{"a", "b"}
		took := waitBalanced("c killed (TTL 2s)", live...)
		if took > 8*time.Second {
			t.Errorf("c's shards were taken %s after the kill, want within the TTL and a few balance rounds", took)
		}
	}
	// A join: d takes its share from the others by handover.
	reps["d"] = start("d", "--shards", count)
	waitBalanced("d joined", append(live, "d")...)
	time.Sleep(2 * time.Second)
	// SIGTERM: a hands every shard over before it exits.
	stopped := time.Now()
	reps["a"].stop()
	if code := reps["a"].ExitCode(); code != 0 {
		t.Errorf("a exited %d after SIGTERM", code)
	}
	t.Logf("a stopped in %s", time.Since(stopped).Round(10*time.Millisecond))
	waitBalanced("a stopped", append(live[1:], "d")...)
	time.Sleep(3 * time.Second)
	to := time.Now().Truncate(time.Second).Add(-2 * time.Second)

	// Each handover (a replica above its share ending a term for one
	// waiting) costs the shard the time from the handover to its new
	// leader's scheduling.
	moves := handovers(t, all())
	for _, m := range moves {
		if m.Gap() > time.Second {
			t.Errorf("shard %d moved from %s to %s in %s, want at most 1 s", m.Shard, m.From, m.To, m.Gap())
		}
	}
	if len(moves) == 0 {
		t.Error("no handover logged: the join moved nothing")
	}
	t.Logf("%d handovers: %v", len(moves), moves)

	r := chaos.Audit(cfg, read(), from, to)
	t.Logf("audited %d slots of %d entries in %d shards from %s to %s: %d duplicate, %d missed, %d dropped",
		r.ExpectedSlots, entries, shards, from.Format(time.TimeOnly), to.Format(time.TimeOnly), len(r.Duplicates), len(r.Missed), len(r.Dropped))
	for i, d := range r.Duplicates {
		if i < 5 {
			t.Errorf("duplicate: %s at %s, %d times", d.Entry, d.Slot.Format(time.RFC3339), d.Count)
		}
	}
	for i, m := range r.Missed {
		if i < 5 {
			t.Errorf("missed: %s at %s", m.Entry, m.Slot.Format(time.RFC3339))
		}
	}
	if !r.OK || len(r.Dropped) > 0 || r.ExpectedSlots < entries*5 {
		t.Errorf("audit: ok %v, %d dropped, %d slots expected", r.OK, len(r.Dropped), r.ExpectedSlots)
	}
}

// etcdValues is every key under prefix with its value.
func etcdValues(t *testing.T, cli *clientv3.Client, prefix string) map[string]string {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

// handovers is each shard handed over (a replica above its share ending
// a term for one waiting) in the replicas' logs, to its next scheduling.
func handovers(t *testing.T, ps []*proc) []chaos.ShardMove {
	var evs []chaos.ShardEvent
	for _, p := range ps {
		e, err := chaos.ReadShardEvents(p.ID, strings.NewReader(p.output()))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e...)
	}
	var out []chaos.ShardMove
	for _, m := range chaos.ShardMoves(evs) {
		// The same replica again is its waiter having withdrawn first, so
		// the shard came back: a move of 0 replicas, timed too.
		if m.Cause == chaos.ShardHandover {
			out = append(out, m)
		}
	}
	return out
}
