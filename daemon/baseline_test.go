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
				waitUnregistered(t, cli, prefix)
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

// TestFileEntriesSeenBeforeATakeover: a file entry carries no time it was
// defined, so a standby keeps when it first saw each entry its file
// gained. Here the standby's file gains 40 entries that the leader's file
// does not have yet (a ConfigMap reaches pods at different times); the
// leader stops 2 s later, having stored no baseline for them, and the
// standby, taking over, owes their slots from when it first saw them:
// every slot from the second after that to the audit's end is in Redis
// exactly once, and none before. Unsharded, and at 2 shards with the
// leader handing over the shard it led.
func TestFileEntriesSeenBeforeATakeover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	const (
		probe = "entries:\n  probe: {task: tasks.t, every: 1s, catchup: all}\n"
		added = 40
	)
	for i, shards := range []int{1, 2} {
		t.Run(fmt.Sprint("shards=", shards), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			pathA, pathB := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
			for _, p := range []string{pathA, pathB} {
				if err := os.WriteFile(p, []byte(probe), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			db := i + 3
			run := func(id, path string) *Main {
				return runMain(t, "--config", path, "--etcd-endpoints", strings.Join(srv.Endpoints, ","), "--prefix", fmt.Sprintf("/seen%d/", i),
					"--id", id, "--broker", rs.URL(db), "--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "200ms",
					"--shards", fmt.Sprint(shards))
			}
			leads := func(m *Main) int {
				if m.shards != nil {
					return len(m.shards.leading())
				}
				if m.leader.Token() != 0 {
					return 1
				}
				return 0
			}
			a := run("a", pathA)
			testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads", func() bool { return leads(a) == shards })
			b := run("b", pathB)
			testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "the shares settled", func() bool {
				return leads(a)+leads(b) == shards && leads(a) == (shards+1)/2
			})
			var y strings.Builder
			y.WriteString(probe)
			for j := range added {
				fmt.Fprintf(&y, "  new-%02d: {task: tasks.t, every: 1s, catchup: all}\n", j)
			}
			if err := os.WriteFile(pathB, []byte(y.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			b.Reload() // as its file watch does (which may not watch yet) and SIGHUP
			testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "b has the new entries", func() bool {
				for j := range added {
					if b.merger.FirstSeen(fmt.Sprintf("new-%02d", j)).IsZero() {
						return false
					}
				}
				return true
			})
			seen := b.merger.FirstSeen("new-00")
			for j := range added {
				if s := b.merger.FirstSeen(fmt.Sprintf("new-%02d", j)); s.After(seen) {
					seen = s
				}
			}
			// Slots fall due while a leads without them.
			time.Sleep(2 * time.Second)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "b leads", func() bool { return leads(b) == shards })
			from := seen.Truncate(time.Second).Add(time.Second)
			to := time.Now().Truncate(time.Second).Add(2 * time.Second)
			cfg, err := config.LoadFile(pathB)
			if err != nil {
				t.Fatal(err)
			}
			// Until every slot is out, or long enough that one missing
			// is missed: the audit below says which.
			var msgs []chaos.Message
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if msgs, err = chaos.ReadQueue(ctx, rs.ClientDB(db), "celery"); err != nil {
					t.Fatal(err)
				}
				if chaos.Audit(cfg, msgs, from, to).OK {
					break
				}
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if msgs, err = chaos.ReadQueue(ctx, rs.ClientDB(db), "celery"); err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				if strings.HasPrefix(m.Entry, "new-") && !m.Slot.After(seen) {
					t.Errorf("%s published for %s, first seen at %s", m.Entry, m.Slot.Format(time.RFC3339Nano), seen.Format(time.RFC3339Nano))
				}
			}
			r := chaos.Audit(cfg, msgs, from, to)
			if !r.OK || r.ExpectedSlots < (added+1)*3 {
				t.Fatalf("audit %s .. %s of %d slots: %d duplicate (%v), %d missed (first %v)", from.Format(time.TimeOnly), to.Format(time.TimeOnly),
					r.ExpectedSlots, len(r.Duplicates), r.Duplicates, len(r.Missed), r.Missed[:min(len(r.Missed), 5)])
			}
			t.Logf("audited %d slots from %s: 0 duplicate, 0 missed", r.ExpectedSlots, from.Format(time.TimeOnly))
		})
	}
}
