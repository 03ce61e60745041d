package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
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

// TestRuntimeEntriesWrittenJustBeforeAStop adds runtime entries through
// the entries API in quick batches and stops the leader right after the
// last, before it has seen (or stored a baseline for) the newest of
// them, then adds more while no leader runs; the next leader starts
// later, at the same shard count or after an offline resize. Every slot of every entry from the end of the
// writes to the audit's end is in the queue exactly once: an entry whose
// baseline was never written owes its slots from when its definition
// was written, caught up by its policy, not from the next leader's start.
func TestRuntimeEntriesWrittenJustBeforeAStop(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte("entries:\n  probe: {task: tasks.t, every: 1s, catchup: all}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	// Enough entries, written fast enough, that the leader is still taking
	// them in when it stops (4,700 a second in the 300,000-entry bench).
	const (
		batches = 20
		batch   = 100
		late    = 100
		entries = batches*batch + late + 1
	)
	const spec = `{"task": "tasks.t", "every": "1s", "catchup": "all"}`
	for i, tc := range []struct {
		name   string
		resize int // the shard count the cluster is resized to while stopped (0: none)
	}{
		{"restart", 0},
		{"resize 1 -> 2", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			prefix := fmt.Sprintf("/bl%d/", i)
			db := i + 1
			args := func(id string, n int) []string {
				return []string{"--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", prefix, "--id", id,
					"--broker", rs.URL(db), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms", "--shards", fmt.Sprint(n)}
			}
			states := func(n int) map[string]store.EntryState {
				if n > 1 {
					return shardStates(t, cli, prefix, n)
				}
				table, err := store.New(cli, prefix).Load(ctx)
				if err != nil {
					t.Fatal(err)
				}
				out := map[string]store.EntryState{}
				for name, st := range table.States() {
					out[name] = *st
				}
				return out
			}
			a := runMain(t, args("a", 1)...)
			testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads (the probe's state)", func() bool { return len(states(1)) == 1 })
			var all []api.EntryDoc
			written := map[string]time.Time{} // when each entry's write began
			for b := range batches {
				docs := make([]api.EntryDoc, batch)
				for j := range docs {
					docs[j] = api.EntryDoc{Name: fmt.Sprintf("tenant-%05d", b*batch+j), Spec: []byte(spec)}
				}
				for _, d := range docs {
					written[d.Name] = time.Now()
				}
				if _, err := a.entriesAPI().PutEntries(ctx, docs, nil); err != nil {
					t.Fatal(err)
				}
				all = append(all, docs...)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			// And more while no leader runs: the entries API a replica
			// serves as a follower (or the last one up, the leader gone)
			// writes them, and none has a baseline for certain.
			standby := &entriesAPI{cli: cli, prefix: prefix, merger: sources.New(sources.Config{Validate: config.CheckEntry}),
				entries: sources.NewEntries(cli, prefix), now: time.Now}
			docs := make([]api.EntryDoc, late)
			for j := range docs {
				docs[j] = api.EntryDoc{Name: fmt.Sprintf("late-%05d", j), Spec: []byte(spec)}
				written[docs[j].Name] = time.Now()
			}
			if _, err := standby.PutEntries(ctx, docs, nil); err != nil {
				t.Fatal(err)
			}
			all = append(all, docs...)
			// The first slot owed by every entry: the whole second after
			// the last definition was written (none is owed a slot from
			// before it existed).
			from := time.Now().Truncate(time.Second).Add(time.Second)
			stored := states(1)
			t.Logf("a stopped with %d of %d entries' states written", len(stored), entries)
			for _, d := range docs {
				if _, ok := stored[d.Name]; ok {
					t.Fatalf("%s has a state before any leader saw it", d.Name)
				}
			}
			n := 1
			if tc.resize > 0 {
				n = tc.resize
				redisPrefix := keys.RedisPrefix("", keys.Cluster(prefix))
				res, err := reshard.Resize(ctx, reshard.Options{Client: cli, Prefix: prefix, To: n, By: "test",
					RaiseFences: func(ctx context.Context, floor int64, from, to int) error {
						return redisbroker.RaiseShardFences(ctx, rs.ClientDB(db), redisPrefix, []int{from, to}, floor)
					}})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("resized 1 -> %d: %d states, %d definitions moved", n, res.Entries, res.Defs)
			}
			// Slots fall due while no leader runs: the next one owes them.
			time.Sleep(2 * time.Second)
			b := runMain(t, args("b", n)...)
			to := time.Now().Truncate(time.Second).Add(2 * time.Second)
			testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "every entry's state past the audit's end", func() bool {
				sts := states(n)
				if len(sts) != entries {
					return false
				}
				for _, st := range sts {
					if st.LastSlot.Before(to) {
						return false
					}
				}
				return true
			})
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			msgs, err := chaos.ReadQueue(ctx, rs.ClientDB(db), "celery")
			if err != nil {
				t.Fatal(err)
			}
			// No entry was owed a slot from before it existed: none of
			// the second its write began in, or earlier.
			for _, m := range msgs {
				if w, ok := written[m.Entry]; ok && !m.Slot.After(w.Truncate(time.Second)) {
					t.Errorf("%s published for %s, written at %s", m.Entry, m.Slot.Format(time.RFC3339Nano), w.Format(time.RFC3339Nano))
				}
			}
			cfg, err := config.LoadFile(cfgPath)
			if err != nil {
				t.Fatal(err)
			}
			list := slices.Clone(cfg.Entries)
			for _, d := range all {
				e, err := cfg.ParseEntry(d.Name, d.Spec)
				if err != nil {
					t.Fatal(err)
				}
				list = append(list, e)
			}
			r := chaos.Audit(cfg.WithEntries(list), msgs, from, to)
			if !r.OK || r.ExpectedSlots < entries*3 {
				t.Fatalf("audit %s .. %s of %d slots: %d duplicate (%v), %d missed (first %v)", from.Format(time.TimeOnly), to.Format(time.TimeOnly),
					r.ExpectedSlots, len(r.Duplicates), r.Duplicates, len(r.Missed), r.Missed[:min(len(r.Missed), 5)])
			}
			t.Logf("audited %d slots: 0 duplicate, 0 missed", r.ExpectedSlots)
		})
	}
}
