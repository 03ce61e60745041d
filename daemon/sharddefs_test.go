package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// gaugeOf is the value of m's gauge name whose labels include want (-1:
// none).
func gaugeOf(t *testing.T, m *Main, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := m.registry.Gather()
	if err != nil {
		t.Fatalf("gather %s's metrics: %v", m.ID, err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			return s.GetGauge().GetValue()
		}
	}
	return -1
}

// TestShardShare: a sharded replica holds the runtime entries of the
// shards it leads and no others. Runtime entries live in their shard's
// defs; a replica alone leads every shard and holds them all; a second
// joins and is handed half the shards, loading those shards' entries
// alone while the first drops them; an entry written on the replica that
// does not lead its shard fires on the one that does, every slot once in
// Redis; the entries API and /status of either replica show every entry
// of the cluster, page by page.
func TestShardShare(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two beatd replicas with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	const (
		prefix = "/share/"
		n      = 4
		first  = 40 // runtime entries written while one replica runs
	)
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte("entries:\n  file-0: {task: tasks.t, every: 1h}\n  file-1: {task: tasks.t, every: 1h}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(id string) *Main {
		return runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", prefix, "--id", id,
			"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms", "--shards", fmt.Sprint(n))
	}
	ctx := context.Background()
	// perShard is how many entries of each shard names holds.
	perShard := func(names []string) []int {
		out := make([]int, n)
		for _, name := range names {
			out[keys.ShardOf(name, n)]++
		}
		return out
	}
	files := perShard([]string{"file-0", "file-1"})
	var runtime []string
	// holds checks that m's shard schedulers hold the file's and the
	// runtime entries of the shards it leads alone, and that its merger
	// holds those runtime entries and no others.
	holds := func(m *Main) bool {
		rt := perShard(runtime)
		api := 0
		for i := range n {
			want := 0
			if m.shards.leads(i) {
				want += files[i] + rt[i]
				api += rt[i]
			}
			if got := gaugeOf(t, m, "beatd_entries", map[string]string{"shard": fmt.Sprint(i)}); got != float64(want) {
				return false
			}
		}
		return gaugeOf(t, m, "beatd_source_entries", map[string]string{"source": sources.API}) == float64(api) ||
			api == 0 && gaugeOf(t, m, "beatd_source_entries", map[string]string{"source": sources.API}) <= 0
	}

	a := start("a")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads all shards", func() bool { return len(a.shards.leading()) == n })
	var docs []api.EntryDoc
	for i := range first {
		name := fmt.Sprintf("tenant-%02d", i)
		runtime = append(runtime, name)
		docs = append(docs, api.EntryDoc{Name: name, Spec: []byte(`{"task": "tasks.t", "every": "1h"}`)})
	}
	if _, err := a.entriesAPI().PutEntries(ctx, docs, nil); err != nil {
		t.Fatal(err)
	}
	// Each definition is in its shard's defs, none under the cluster's.
	resp, err := a.etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if name, ok := strings.CutPrefix(k, keys.Defs(prefix)); ok {
			t.Errorf("runtime entry %s under the unsharded defs", name)
		}
		for i := range n {
			if name, ok := strings.CutPrefix(k, keys.Defs(keys.Shard(prefix, i, n))); ok {
				stored++
				if keys.ShardOf(name, n) != i {
					t.Errorf("%s stored in shard %d, belongs to %d", name, i, keys.ShardOf(name, n))
				}
			}
		}
	}
	if stored != first {
		t.Errorf("%d definitions stored in shards, want %d", stored, first)
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "a holds every runtime entry", func() bool { return holds(a) })

	b := start("b")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a and b lead half the shards each, holding their entries alone", func() bool {
		return len(a.shards.leading()) == n/2 && len(b.shards.leading()) == n/2 && holds(a) && holds(b)
	})

	// An entry of each of b's shards, written on a, fires on b: every
	// slot once.
	var added []string
	var extra []api.EntryDoc
	for i := 0; len(added) < n/2; i++ {
		name := fmt.Sprintf("late-%d", i)
		if !b.shards.leads(keys.ShardOf(name, n)) || slices.ContainsFunc(added, func(o string) bool { return keys.ShardOf(o, n) == keys.ShardOf(name, n) }) {
			continue
		}
		added = append(added, name)
		extra = append(extra, api.EntryDoc{Name: name, Spec: []byte(`{"task": "tasks.t", "every": "1s"}`)})
	}
	if _, err := a.entriesAPI().PutEntries(ctx, extra, nil); err != nil {
		t.Fatal(err)
	}
	runtime = append(runtime, added...)
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "b holds the entries written on a, a does not", func() bool {
		return holds(a) && holds(b) && a.runningConfig().Entry(added[0]) == nil && b.runningConfig().Entry(added[0]) != nil
	})
	from := time.Now().Truncate(time.Second).Add(time.Second)

	// The entries API on a pages through every entry of the cluster, in
	// name order, those b runs active with their schedule.
	var listed []string
	q := api.ListQuery{Limit: 7}
	for {
		page, err := a.entriesAPI().ListEntries(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			if !e.Active {
				t.Errorf("entry %s listed on a as not running: %s", e.Name, e.Problem)
			}
			listed = append(listed, e.Name)
		}
		if page.Next == "" {
			break
		}
		q.After = page.Next
	}
	want := append([]string{"file-0", "file-1"}, runtime...)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("entries API on a lists %v, want %v", listed, want)
	}
	// So does /status, page by page, with the total of the cluster.
	shown := statusPages(t, a, 9, len(want))
	if !slices.Equal(shown, want) {
		t.Errorf("/status on a shows %v, want %v", shown, want)
	}

	time.Sleep(3 * time.Second)
	to := time.Now().Truncate(time.Second).Add(-time.Second)
	msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
	if err != nil {
		t.Fatal(err)
	}
	file, err := config.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var audited []*config.Entry
	for _, d := range extra {
		e, err := file.ParseEntry(d.Name, d.Spec)
		if err != nil {
			t.Fatal(err)
		}
		audited = append(audited, e)
	}
	r := chaos.Audit(file.WithEntries(audited), slices.DeleteFunc(msgs, func(m chaos.Message) bool { return !strings.HasPrefix(m.Entry, "late-") }), from, to)
	if !r.OK || r.ExpectedSlots < len(added)*2 {
		t.Fatalf("audit of %d slots: %d duplicate (%v), %d missed (%v)", r.ExpectedSlots, len(r.Duplicates), r.Duplicates, len(r.Missed), r.Missed)
	}
	t.Logf("audited %d slots of entries written on the replica that does not lead their shards: 0 duplicate, 0 missed", r.ExpectedSlots)

	// A trigger asked of a, for a runtime entry of b's shard (which a does
	// not hold), is queued and sent by b.
	if _, err := a.api.Request(ctx, api.Action{Op: string(store.OpTrigger), Entry: added[0]}); err != nil {
		t.Fatalf("trigger %s on a: %v", added[0], err)
	}
	if _, err := a.api.Request(ctx, api.Action{Op: string(store.OpTrigger), Entry: "no-such-entry"}); !errors.Is(err, api.ErrUnknownEntry) {
		t.Errorf("trigger of an unknown entry: %v, want %v", err, api.ErrUnknownEntry)
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the trigger sent", func() bool {
		msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
		return err == nil && slices.ContainsFunc(msgs, func(m chaos.Message) bool { return m.Manual && m.Entry == added[0] })
	})

	// b stops: a takes its shards and loads their entries.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads every shard again, holding every entry", func() bool {
		return len(a.shards.leading()) == n && holds(a)
	})
}
