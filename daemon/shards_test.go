package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestShardCount: a cluster's shard count is recorded once, when a
// sharded cluster is made; a replica with another count is refused with
// both counts named and nothing written; one shard writes nothing at all.
func TestShardCount(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		existing map[string]string // keys under the prefix before the replica starts
		n        int
		wantErr  string // empty: accepted
		wantKey  string // the shard count key's value after ("" : absent)
	}{
		{name: "a new cluster of one shard writes nothing", n: 1},
		{name: "a new sharded cluster records its count", n: 4, wantKey: "4"},
		{name: "the same count again", existing: map[string]string{"shard-count": "4"}, n: 4, wantKey: "4"},
		{name: "another count", existing: map[string]string{"shard-count": "4"}, n: 8, wantKey: "4",
			wantErr: "--shards 8, but the cluster at /p/ was made with 4 shards; start every replica with --shards 4"},
		{name: "one shard on a sharded cluster", existing: map[string]string{"shard-count": "4"}, n: 1, wantKey: "4",
			wantErr: "--shards 1, but the cluster at /p/ was made with 4 shards"},
		{name: "an upgraded cluster of one shard runs on", existing: map[string]string{"state/00": "x", "leader/694d": "a"}, n: 1},
		{name: "an unsharded cluster cannot be sharded by a flag", existing: map[string]string{"state/00": "x"}, n: 4,
			wantErr: "--shards 4, but the cluster at /p/ was made with 1 shard"},
		{name: "nor while its replicas run", existing: map[string]string{"replicas/a": "{}"}, n: 2,
			wantErr: "was made with 1 shard"},
		{name: "a count that is not one", existing: map[string]string{"shard-count": "x"}, n: 2, wantKey: "x",
			wantErr: `is "x", not a count`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const prefix = "/p/"
			if _, err := cli.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.existing {
				if _, err := cli.Put(ctx, prefix+k, v); err != nil {
					t.Fatal(err)
				}
			}
			err := checkShardCount(ctx, cli, prefix, tc.n)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
			case strings.Contains(tc.wantErr, "made with") && !errors.Is(err, ErrShardCount):
				t.Fatalf("err = %v, not ErrShardCount", err)
			}
			resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			wantCount := len(tc.existing)
			if _, had := tc.existing["shard-count"]; tc.wantKey != "" && !had {
				wantCount++ // the count it recorded
			}
			if int(resp.Count) != wantCount {
				t.Errorf("%d keys under the prefix, want %d (%d before)", resp.Count, wantCount, len(tc.existing))
			}
			got, err := cli.Get(ctx, keys.ShardCount(prefix))
			if err != nil {
				t.Fatal(err)
			}
			var v string
			if len(got.Kvs) == 1 {
				v = string(got.Kvs[0].Value)
			}
			if v != tc.wantKey {
				t.Errorf("shard count %q, want %q", v, tc.wantKey)
			}
		})
	}
}

// TestOneShardKeysUnchanged: a replica run without --shards (one shard)
// writes the keys beatd wrote before sharding, in etcd and in Redis: no
// shard count, no shards/ prefix, the unsuffixed fence.
func TestOneShardKeysUnchanged(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	cfg := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfg, []byte("entries:\n  tick: {task: tasks.add, every: 200ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := runMain(t, "--config", cfg, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", "/one/",
		"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms")
	if m.shards != nil {
		t.Fatal("one shard runs a shard set")
	}
	ctx := context.Background()
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a fire and its state", func() bool {
		resp, err := m.etcd.Get(ctx, keys.State("/one/"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count > 0 && rs.Client().LLen(ctx, "celery").Val() > 0
	})
	resp, err := m.etcd.Get(ctx, "/one/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if k := string(kv.Key); strings.Contains(k, "shard") {
			t.Errorf("one shard wrote %s", k)
		}
	}
	rkeys := rs.Client().Keys(ctx, "beatd:{one}:*").Val()
	if !slices.Contains(rkeys, "beatd:{one}:fence") || !slices.Contains(rkeys, "beatd:{one}:slots-term") {
		t.Errorf("Redis keys %v, want the unsuffixed fence and slots-term", rkeys)
	}
	for _, k := range rkeys {
		if strings.HasPrefix(k, "beatd:{one}:fence:") || strings.HasPrefix(k, "beatd:{one}:slots-term:") {
			t.Errorf("one shard wrote %s", k)
		}
	}
}

// TestShardHandover runs two sharded replicas in one process (so -race
// sees the shards' loops, their balance and the stop): the second takes
// half the shards by handover, then the first stops and hands its shards
// over. Every slot is in the queue exactly once.
func TestShardHandover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two beatd replicas with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	var y strings.Builder
	y.WriteString("entries:\n")
	for i := range 8 {
		fmt.Fprintf(&y, "  e%d: {task: tasks.t, every: 1s, catchup: all}\n", i)
	}
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(id string) *Main {
		return runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", "/sh/", "--id", id,
			"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms", "--shards", "4")
	}
	a := start("a")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads all 4 shards", func() bool { return len(a.shards.leading()) == 4 })
	from := time.Now().Truncate(time.Second).Add(time.Second)
	b := start("b")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a and b lead 2 shards each", func() bool {
		return len(a.shards.leading()) == 2 && len(b.shards.leading()) == 2
	})
	// /status: each replica is a leader, of the shards it flags.
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "each replica's /status flags its 2 shards and overlays their last results", func() bool {
		for _, m := range []*Main{a, b} {
			st, err := m.api.Status(context.Background(), api.StatusQuery{Limit: api.DefaultStatusLimit})
			if err != nil || !st.Leader || len(st.Shards) != 4 {
				return false
			}
			mine := 0
			for _, sh := range st.Shards {
				if sh.Leader != (sh.LeaderID == m.ID) {
					return false
				}
				if sh.Leader {
					mine++
				}
			}
			if mine != 2 {
				return false
			}
			// The last result, which only a leader's memory holds, is
			// overlaid for the entries of the shards it leads.
			for _, e := range st.Entries {
				if st.Shards[keys.ShardOf(e.Name, 4)].Leader && e.Name != "e5" && e.LastResult != "ok" {
					return false
				}
			}
		}
		return true
	})
	// The console shows who leads each shard, with its token, and which
	// shards each replica leads.
	testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "the console's shards table", func() bool {
		st, err := a.api.Status(context.Background(), api.StatusQuery{Limit: 1})
		if err != nil || len(st.Shards) != 4 {
			return false
		}
		resp, err := http.Get("http://" + b.HTTPAddress() + "/")
		if err != nil {
			return false
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, sh := range st.Shards {
			row := fmt.Sprintf("<tr data-shard=\"%d\">\n <th scope=\"row\" data-label=\"Shard\">%d</th>\n <td data-label=\"Leader\"><strong>%s</strong></td>\n <td data-label=\"Token\">%d</td>",
				sh.Shard, sh.Shard, sh.LeaderID, sh.FencingToken)
			if !strings.Contains(string(page), row) {
				return false
			}
		}
		return strings.Count(string(page), "<strong>leader</strong> of shards ") == 2 && strings.Contains(string(page), "sharded: 4 shards")
	})
	// Admin requests are queued on any replica for the cluster, and done
	// by the leader of the entry's shard.
	ctx := context.Background()
	for _, r := range []store.Request{{Op: store.OpTrigger, Entry: "e3"}, {Op: store.OpPause, Entry: "e5"}} {
		if _, err := b.store.PutRequest(ctx, r, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the requests done: e3 sent by hand, e5 paused in status", func() bool {
		msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
		if err != nil {
			return false
		}
		manual := slices.ContainsFunc(msgs, func(m chaos.Message) bool { return m.Manual && m.Entry == "e3" })
		st, err := status.FromEtcd(ctx, a.etcd, "/sh/", a.sched.Config(), nil, time.Now(), api.StatusQuery{Limit: api.DefaultStatusLimit})
		paused := err == nil && slices.ContainsFunc(st.Entries, func(e api.EntryStatus) bool { return e.Name == "e5" && e.Paused })
		pending, _, _ := b.store.PendingRequests(ctx)
		return manual && paused && len(pending) == 0
	})
	// A runtime entry written on one replica (the entries API's store)
	// reaches the scheduler of its shard, whoever leads it.
	if _, err := a.entries.Put(ctx, []sources.Doc{{Name: "runtime-1", Data: []byte(`{"task": "tasks.t", "every": "1s"}`)}}, nil); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the runtime entry fired", func() bool {
		msgs, err := chaos.ReadQueue(ctx, rs.Client(), "celery")
		return err == nil && slices.ContainsFunc(msgs, func(m chaos.Message) bool { return m.Entry == "runtime-1" && !m.Manual })
	})
	// The catalog (what `beatd next` reads) is the cluster's, published by
	// shard 0's leader under its fence.
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the catalog published", func() bool {
		resp, err := b.etcd.Get(ctx, keys.CatalogHeader("/sh/"), clientv3.WithCountOnly())
		return err == nil && resp.Count == 1
	})
	time.Sleep(1500 * time.Millisecond)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "b leads all 4 shards", func() bool { return len(b.shards.leading()) == 4 })
	time.Sleep(2 * time.Second)
	to := time.Now().Truncate(time.Second).Add(-time.Second)

	msgs, err := chaos.ReadQueue(context.Background(), rs.Client(), "celery")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.WithEntries(slices.DeleteFunc(slices.Clone(cfg.Entries), func(e *config.Entry) bool { return e.Name == "e5" })) // paused
	r := chaos.Audit(cfg, msgs, from, to)
	if !r.OK || r.ExpectedSlots < 7*3 {
		t.Fatalf("audit of %d slots: %d duplicate (%v), %d missed (%v)", r.ExpectedSlots, len(r.Duplicates), r.Duplicates, len(r.Missed), r.Missed)
	}
	t.Logf("audited %d slots: 0 duplicate, 0 missed", r.ExpectedSlots)
	// /metrics counts the shards' fires: across both replicas every
	// message in the queue is one ok fire (a fire deduplicated after a
	// handover is ok too, and counted apart), each labelled with its shard.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if msgs, err = chaos.ReadQueue(context.Background(), rs.Client(), "celery"); err != nil {
		t.Fatal(err)
	}
	published := 0
	for _, m := range msgs {
		if !m.Manual {
			published++
		}
	}
	ok, dedup, shardsSeen := 0.0, 0.0, map[string]bool{}
	for _, m := range []*Main{a, b} {
		mfs, err := m.registry.Gather()
		if err != nil {
			t.Fatalf("gather %s's metrics: %v", m.ID, err)
		}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				switch {
				case mf.GetName() == "beatd_fires_total" && labels["result"] == "ok":
					ok += s.GetCounter().GetValue()
					if s.GetCounter().GetValue() > 0 {
						shardsSeen[labels["shard"]] = true
					}
				case mf.GetName() == "beatd_fires_deduplicated_total":
					dedup += s.GetCounter().GetValue()
				}
			}
		}
	}
	if int(ok-dedup) != published || len(shardsSeen) != 4 || shardsSeen[""] {
		t.Errorf("beatd_fires_total{result=ok} %v less %v deduplicated, want the %d published; shards with fires %v, want 0-3", ok, dedup, published, shardsSeen)
	}
}

// TestShardOutcomes: on a sharded cluster every shard's loop sees its
// entries' task events from a real Celery worker (-E), whichever replica
// leads it: every entry, one or more in each shard, records a succeeded
// run; pause_after_failures pauses a failing entry; overlap: skip never
// lets two runs of its entry execute at once on a pool that would.
func TestShardOutcomes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two beatd replicas with etcd, Redis and a Celery worker")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Events: true, Pool: "prefork", Concurrency: 4, Name: "shards@%h"})
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
	y.WriteString("  skipper: {task: tasks.sleep, every: 1s, args: [1.6, skip], overlap: skip}\n")
	y.WriteString("  allowed: {task: tasks.sleep, every: 1s, args: [1.6, allow]}\n")
	if keys.ShardOf("boom", shards) == keys.ShardOf("skipper", shards) {
		t.Fatal("boom and skipper share a shard: pick names in two")
	}
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(id string) *Main {
		return runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", "/so/", "--id", id,
			"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms", "--shards", strconv.Itoa(shards))
	}
	a, b := start("a"), start("b")
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a and b lead 2 shards each", func() bool {
		return len(a.shards.leading()) == 2 && len(b.shards.leading()) == 2
	})
	ctx := context.Background()
	entry := func(st api.Status, name string) api.EntryStatus {
		for _, e := range st.Entries {
			if e.Name == name {
				return e
			}
		}
		return api.EntryStatus{}
	}
	has := func(e api.EntryStatus, outcome string) bool {
		return slices.ContainsFunc(e.Runs, func(r status.RunOutcome) bool { return r.Outcome == outcome })
	}
	// runsOf is the finished runs of tasks.sleep with mark, as the worker
	// timed them, in start order.
	runsOf := func(mark string) [][2]float64 {
		var runs [][2]float64
		metas, _ := rs.ClientDB(1).Keys(ctx, "celery-task-meta-*").Result()
		for _, k := range metas {
			var meta struct {
				Status string `json:"status"`
				Result struct {
					Start, End float64
					Mark       string
				} `json:"result"`
			}
			raw, err := rs.ClientDB(1).Get(ctx, k).Bytes()
			if err == nil && json.Unmarshal(raw, &meta) == nil && meta.Status == "SUCCESS" && meta.Result.Mark == mark {
				runs = append(runs, [2]float64{meta.Result.Start, meta.Result.End})
			}
		}
		slices.SortFunc(runs, func(x, y [2]float64) int { return cmp.Compare(x[0], y[0]) })
		return runs
	}
	overlapped := func(runs [][2]float64) bool {
		for i := 1; i < len(runs); i++ {
			if runs[i][0] < runs[i-1][1] {
				return true
			}
		}
		return false
	}
	var st api.Status
	testutil.EventuallyErr(t, 30*time.Second, 200*time.Millisecond, "every shard's outcomes: succeeded, paused, skipped", func() error {
		var err error
		if st, err = status.FromEtcd(ctx, a.etcd, "/so/", a.sched.Config(), nil, time.Now(), api.StatusQuery{Limit: api.DefaultStatusLimit}); err != nil {
			return err
		}
		for _, name := range oks {
			if !has(entry(st, name), "succeeded") {
				return fmt.Errorf("%s (shard %d) has no succeeded run: %+v", name, keys.ShardOf(name, shards), entry(st, name).Runs)
			}
		}
		skipper := entry(st, "skipper")
		switch {
		case !entry(st, "boom").Paused:
			return fmt.Errorf("boom is not paused: %+v", entry(st, "boom").Runs)
		case !has(skipper, "skipped") || !has(skipper, "succeeded"):
			return fmt.Errorf("skipper has not both skipped and succeeded: %+v", skipper.Runs)
		case len(runsOf("skip")) < 3:
			return fmt.Errorf("skipper ran %d times, want 3 or more", len(runsOf("skip")))
		case !overlapped(runsOf("allow")):
			return fmt.Errorf("allowed's runs never overlapped: %v", runsOf("allow"))
		}
		return nil
	})
	if boom := entry(st, "boom"); !strings.Contains(boom.PauseReason, "ZeroDivisionError") {
		t.Errorf("boom paused for %q, want its exception", boom.PauseReason)
	}
	// The worker's own times: skip's runs never overlapped, while the
	// same task without a policy did (the pool could run them at once).
	skips := runsOf("skip")
	for i := 1; i < len(skips); i++ {
		if skips[i][0] < skips[i-1][1] {
			t.Errorf("skipper's runs overlapped: one started at %.3f while the one before ran until %.3f", skips[i][0], skips[i-1][1])
		}
	}
	t.Logf("%d entries over %d shards: every one's outcomes seen; boom paused; skipper ran %d times without overlap", len(oks)+3, shards, len(skips))
}

// TestShardReadiness: /readyz reports a led shard that cannot publish,
// by its shard, while the broker still answers PING (Redis refuses writes
// past maxmemory), and is ready again once the shard publishes.
func TestShardReadiness(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte("entries:\n  e0: {task: tasks.t, every: 200ms}\n  e1: {task: tasks.t, every: 200ms}\n  e2: {task: tasks.t, every: 200ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A lease long enough that -race on two loaded cores keeps the
	// terms: with 2s, shards changed terms mid-test, and a new term has
	// no publish error to report until its first publish fails.
	m := runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", "/rz/", "--id", "a",
		"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "6s", "--state-interval", "200ms", "--shards", "2")
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + m.HTTPAddress() + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "ready, leading both shards", func() bool {
		code, _ := readyz()
		return code == http.StatusOK && len(m.shards.leading()) == 2
	})
	ctx := context.Background()
	rdb := rs.Client()
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	var body string
	testutil.EventuallyErr(t, 10*time.Second, 50*time.Millisecond, "not ready: a shard cannot publish", func() error {
		var code int
		code, body = readyz()
		if code == http.StatusServiceUnavailable && strings.Contains(body, "shard ") && strings.Contains(body, "cannot publish") {
			return nil
		}
		return fmt.Errorf("/readyz said %d %q while leading %+v", code, body, m.shards.leading())
	})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("the broker should answer PING while it refuses writes: %v", err)
	}
	t.Logf("/readyz while Redis refuses writes: %s", strings.TrimSpace(body))
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "ready again", func() bool {
		code, _ := readyz()
		return code == http.StatusOK
	})
}

// TestShardColdStart: replicas started together win their own shares at
// once, not every shard for the first one up; a running cluster, or the
// end of the cold start, brings back the usual rules.
func TestShardColdStart(t *testing.T) {
	began := time.Date(2026, 12, 5, 18, 0, 0, 0, time.UTC)
	ids := []string{"a", "b", "c"}
	unled := &shardView{leaders: make([]string, 16), waiters: make([][]string, 16), held: map[string]int{}}
	ownOnly := &shardView{leaders: make([]string, 16), waiters: make([][]string, 16), held: map[string]int{"b": 2}}
	running := &shardView{leaders: make([]string, 16), waiters: make([][]string, 16), held: map[string]int{"a": 1}}
	for _, tc := range []struct {
		name       string
		after      time.Duration
		view       *shardView
		ids        []string
		shard      int
		cold, want bool
	}{
		{name: "nothing read yet", after: time.Second, ids: nil, shard: 1, cold: true},
		{name: "settling: the others may not have registered", after: 500 * time.Millisecond, view: unled, ids: ids, shard: 1, cold: true},
		{name: "its own shard (1 mod 3 = rank of b)", after: time.Second, view: unled, ids: ids, shard: 1, cold: true, want: true},
		{name: "its own shard (13 mod 3)", after: time.Second, view: ownOnly, ids: ids, shard: 13, cold: true, want: true},
		{name: "another's shard", after: time.Second, view: unled, ids: ids, shard: 2, cold: true},
		{name: "its registration not read yet", after: time.Second, view: unled, ids: []string{"a", "c"}, shard: 1, cold: true},
		{name: "another replica leads: a running cluster", after: time.Second, view: running, ids: ids, shard: 2},
		{name: "past the cold start", after: shardColdStart, view: unled, ids: ids, shard: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &shardSet{id: "b", clock: clockwork.NewFakeClockAt(began.Add(tc.after)), began: began}
			if tc.view != nil {
				s.view.Store(tc.view)
			}
			if tc.ids != nil {
				// As readLive stores them: itself counted live,
				// registered or not.
				ids, registered := tc.ids, slices.Contains(tc.ids, "b")
				if !registered {
					ids = append(slices.Clone(ids), "b")
					slices.Sort(ids)
				}
				s.ids.Store(&ids)
				s.registered.Store(registered)
			}
			cold, want := s.coldWants(&shard{i: tc.shard})
			if cold != tc.cold || want != tc.want {
				t.Errorf("coldWants = cold %v, want %v; expected cold %v, want %v", cold, want, tc.cold, tc.want)
			}
		})
	}
}
