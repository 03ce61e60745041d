package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestShardResize runs a cluster at 4 shards, stops it, resizes it to 8
// and runs it again: every slot from the first run's start to the second
// run's end is in the queue exactly once, the downtime's slots caught up
// from the state that moved. Resizes are refused, changing nothing, while
// a replica runs, to the same count, out of bounds and while another
// resize holds the lock; a resize killed after staging or after clearing
// the tables is finished by a rerun, and a replica refuses to start in
// between. Going to 1 shard leaves an unsharded cluster's keys.
func TestShardResize(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	const prefix = "/rs/"
	var y strings.Builder
	y.WriteString("entries:\n")
	for i := range 16 {
		fmt.Fprintf(&y, "  e%d: {task: tasks.t, every: 1s, catchup: all}\n", i)
	}
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := func(id string, n int) []string {
		return []string{"--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", prefix, "--id", id,
			"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms", "--shards", fmt.Sprint(n)}
	}
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	a := runMain(t, args("a", 4)...)
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads all 4 shards", func() bool { return len(a.shards.leading()) == 4 })
	var maxToken int64
	for _, l := range a.shards.leading() {
		maxToken = max(maxToken, l.Token)
	}
	// Runtime entries, each kept in its shard's defs, move with the
	// states and fire exactly once across the resize too.
	var runtime []sources.Doc
	for i := range 8 {
		runtime = append(runtime, sources.Doc{Name: fmt.Sprintf("r%d", i), Data: []byte(`{"task": "tasks.t", "every": "1s", "catchup": "all"}`)})
	}
	if _, err := a.entries.Put(ctx, runtime, nil); err != nil {
		t.Fatal(err)
	}
	wantDefs := map[string]string{}
	for _, d := range runtime {
		wantDefs[d.Name] = string(d.Data)
	}
	if got := shardDefsIn(t, cli, prefix, 4); !maps.Equal(got, wantDefs) {
		t.Fatalf("runtime entries at 4 shards %v, want %v", got, wantDefs)
	}
	const entries = 16 + 8
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "every runtime entry has a state", func() bool {
		return len(shardStates(t, cli, prefix, 4)) == entries
	})
	from := time.Now().Truncate(time.Second).Add(time.Second)
	// Each resize raises the shards' Redis fences (as `beatd shards
	// resize --broker` does); floors are the floors it raised them to.
	var floors []int64
	redisPrefix := keys.RedisPrefix("", keys.Cluster(prefix))
	resize := func(to int) (reshard.Result, error) {
		return reshard.Resize(ctx, reshard.Options{Client: cli, Prefix: prefix, To: to, By: "test",
			RaiseFences: func(ctx context.Context, floor int64, from, to int) error {
				floors = append(floors, floor)
				return redisbroker.RaiseShardFences(ctx, rs.Client(), redisPrefix, []int{from, to}, floor)
			}})
	}
	// unchanged checks that a refused resize wrote nothing.
	unchanged := func(what, count string) {
		t.Helper()
		resp, err := cli.Get(ctx, keys.Resize(prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 0 {
			t.Errorf("%s: %v resize keys left (%v)", what, resp.Count, err)
		}
		if got := getValue(t, cli, keys.ShardCount(prefix)); got != count {
			t.Errorf("%s: shard count %q, want %q", what, got, count)
		}
	}
	if _, err := resize(8); !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "registered (a)") {
		t.Errorf("resize with a replica running: %v, want refused naming it", err)
	}
	unchanged("running", "4")
	time.Sleep(2 * time.Second)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// The refusals below are of a stopped cluster.
	waitUnregistered(t, cli, prefix)
	before := shardStates(t, cli, prefix, 4)
	if len(before) != entries {
		t.Fatalf("%d states after the first run, want %d", len(before), entries)
	}

	// Refusals of a stopped cluster, and of a lock held by another resize.
	for _, tc := range []struct {
		name string
		to   int
		want string
	}{
		{"same count", 4, "has a shard count of 4 already"},
		{"zero", 0, "a cluster has 1 to 256"},
		{"too many", 257, "a cluster has 1 to 256"},
	} {
		if _, err := resize(tc.to); !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.want)
		}
		unchanged(tc.name, "4")
	}
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	// Another resize's lock, as reshard writes it.
	held := `{"by":"host-x pid 7","since":"2026-01-02T03:04:05Z","from":4,"to":16}`
	if _, err := cli.Put(ctx, keys.ResizeLock(prefix), held, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := resize(8); !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "in progress since 2026-01-02T03:04:05Z by host-x pid 7") {
		t.Errorf("concurrent resize: %v, want refused naming the other", err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	unchanged("concurrent", "4")

	res, err := resize(8)
	if err != nil || res.From != 4 || res.To != 8 || res.Entries != entries || res.Defs != len(runtime) || res.Resumed {
		t.Fatalf("resize 4 -> 8: %+v, %v", res, err)
	}
	t.Logf("resized 4 -> 8 in %s", res.Took)
	// Every fence of both counts is above every token a held, so a
	// replica of 4 shards that woke now could publish nothing.
	if len(floors) != 1 || floors[0] <= maxToken {
		t.Fatalf("fences raised to %v; a's tokens were up to %d", floors, maxToken)
	}
	for i := range 8 {
		if got, err := rs.Client().Get(ctx, fmt.Sprintf("%sfence:%d", redisPrefix, i)).Int64(); err != nil || got != floors[0] {
			t.Errorf("fence:%d = %d (%v) after the resize, want %d", i, got, err, floors[0])
		}
	}
	if after := shardStates(t, cli, prefix, 8); !sameStates(before, after) {
		t.Fatalf("states moved 4 -> 8 differ:\nbefore %v\nafter  %v", before, after)
	}
	if got := shardDefsIn(t, cli, prefix, 8); !maps.Equal(got, wantDefs) {
		t.Fatalf("runtime entries moved 4 -> 8: %v, want %v", got, wantDefs)
	}

	b := runMain(t, args("b", 8)...)
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "b leads all 8 shards", func() bool { return len(b.shards.leading()) == 8 })
	// Two seconds of b's own slots, and an audited window of at least four
	// seconds in all however long the starts and the resize took on a
	// loaded machine (it once left three).
	time.Sleep(max(2*time.Second, time.Until(from.Add(6*time.Second))))
	// The audit ends at a slot every entry's state has passed, so a
	// loop that runs late on a loaded machine is not taken for one that
	// missed a slot (a loop that does miss it stays behind, and fails).
	to := time.Now().Truncate(time.Second).Add(-time.Second)
	testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "every entry's state past the audit's end", func() bool {
		states := shardStates(t, cli, prefix, 8)
		if len(states) != entries {
			return false
		}
		for _, st := range states {
			if st.LastSlot.Before(to) {
				return false
			}
		}
		return true
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	list := slices.Clone(cfg.Entries)
	for _, d := range runtime {
		e, err := cfg.ParseEntry(d.Name, d.Data)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, e)
	}
	cfg = cfg.WithEntries(list)
	r := chaos.Audit(cfg, msgs, from, to)
	if !r.OK || r.ExpectedSlots < entries*4 {
		t.Fatalf("audit of %d slots: %d duplicate (%v), %d missed (%v)", r.ExpectedSlots, len(r.Duplicates), r.Duplicates, len(r.Missed), r.Missed)
	}
	t.Logf("audited %d slots across the resize: 0 duplicate, 0 missed", r.ExpectedSlots)

	// A resize killed after staging, then one killed after clearing the
	// tables: each is finished by a rerun once its lock's lease is gone,
	// and a replica refuses to start in between.
	before = shardStates(t, cli, prefix, 8)
	for _, k := range []struct {
		to        int
		stopAfter string
	}{{2, "staged"}, {1, "cleared"}} {
		if _, err := reshard.Resize(ctx, reshard.Options{Client: cli, Prefix: prefix, To: k.to, By: "test", StopAfter: k.stopAfter}); err == nil {
			t.Fatalf("resize stopped after %s: no error", k.stopAfter)
		}
		lock, err := cli.Get(ctx, keys.ResizeLock(prefix))
		if err != nil || len(lock.Kvs) != 1 {
			t.Fatalf("after %s: lock %v, %v", k.stopAfter, lock, err)
		}
		if _, err := resize(k.to); !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "in progress since") {
			t.Errorf("rerun while the lock's lease lives: %v, want refused", err)
		}
		if _, err := resize(k.to + 4); !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), fmt.Sprintf("run `beatd shards resize %d` to finish it", k.to)) {
			t.Errorf("another count while unfinished: %v, want refused naming the count to finish", err)
		}
		m := newTestMain(io.Discard, io.Discard)
		if err := m.ParseFlags(ctx, args("c", k.to)); err != nil {
			t.Fatal(err)
		}
		if err := m.Run(ctx); !errors.Is(err, reshard.ErrResizing) {
			t.Errorf("replica started during an unfinished resize: %v, want ErrResizing", err)
		}
		_ = m.Close()
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(lock.Kvs[0].Lease)); err != nil { // as its TTL would
			t.Fatal(err)
		}
		res, err := resize(k.to)
		if err != nil || !res.Resumed || res.To != k.to || res.Entries != entries || res.Defs != len(runtime) {
			t.Fatalf("rerun after %s: %+v, %v", k.stopAfter, res, err)
		}
		if after := shardStates(t, cli, prefix, k.to); !sameStates(before, after) {
			t.Fatalf("states after the rerun to %d differ:\nbefore %v\nafter  %v", k.to, before, after)
		}
		if got := shardDefsIn(t, cli, prefix, k.to); !maps.Equal(got, wantDefs) {
			t.Fatalf("runtime entries after the rerun to %d: %v, want %v", k.to, got, wantDefs)
		}
	}
	// One shard is an unsharded cluster: no count, nothing under shards/
	// or resize/, the state under the cluster's prefix.
	all, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range all.Kvs {
		if k := string(kv.Key); strings.Contains(k, "shard") || strings.Contains(k, "resize") {
			t.Errorf("one shard after resize has %s", k)
		}
	}
	if st, err := store.New(cli, prefix).Load(ctx); err != nil || st.Len() != entries {
		t.Errorf("the unsharded state table: %v entries, %v", st.Len(), err)
	}
}

// shardStates is every entry's state in the n tables of a cluster of n
// shards, each read from the table of its shard (an entry in another
// table is an error).
// waitUnregistered waits, as an operator does before an offline resize,
// for every replica's registration under prefix to be gone. Close revokes
// its registration best effort within a second, and under -race on 2
// cores that revoke can miss it (one run in three in CI); the lease then
// ends the registration within its TTL, which is what this waits for.
func waitUnregistered(t *testing.T, cli *clientv3.Client, prefix string) {
	t.Helper()
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "every replica's registration gone", func() bool {
		resp, err := cli.Get(context.Background(), keys.Replicas(prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
}

func shardStates(t *testing.T, cli *clientv3.Client, prefix string, n int) map[string]store.EntryState {
	t.Helper()
	out := map[string]store.EntryState{}
	for i := range n {
		tab, err := store.New(cli, keys.Shard(prefix, i, n)).Load(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tab.Range(func(st store.EntryState) bool {
			if keys.ShardOf(st.Name, n) != i {
				t.Errorf("%s is in shard %d of %d, want %d", st.Name, i, n, keys.ShardOf(st.Name, n))
			}
			out[st.Name] = st
			return true
		})
	}
	return out
}

// shardDefsIn is every runtime entry's definition in the n shards of a
// cluster (the cluster's defs/ for one), each read from its shard's
// prefix (one in another shard's is an error), and none elsewhere.
func shardDefsIn(t *testing.T, cli *clientv3.Client, prefix string, n int) map[string]string {
	t.Helper()
	out := map[string]string{}
	docs, _, err := sources.NewShardedEntries(cli, prefix, n).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		out[d.Name] = string(d.Data)
	}
	// Every key named defs/ lies in its shard's prefix.
	all, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range all.Kvs {
		k := string(kv.Key)
		if !strings.Contains(k, "/defs/") {
			continue
		}
		name := k[strings.LastIndex(k, "/defs/")+len("/defs/"):]
		if want := keys.Defs(keys.Shard(prefix, keys.ShardOf(name, n), n)) + name; k != want {
			t.Errorf("runtime entry at %s, want %s", k, want)
		}
	}
	return out
}

func sameStates(a, b map[string]store.EntryState) bool {
	if len(a) != len(b) {
		return false
	}
	for name, st := range a {
		o, ok := b[name]
		if !ok || !st.LastSlot.Equal(o.LastSlot) || !st.Since.Equal(o.Since) || st.Paused != o.Paused || st.Runs != o.Runs {
			return false
		}
	}
	return true
}

func getValue(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}
