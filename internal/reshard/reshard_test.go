package reshard

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestResize runs on one embedded etcd (each case under its own prefix):
// a large prefix is cleared in several bounded deletes, each fenced, and
// a resize killed after writing the new tables, while it deletes its
// staging copies, is finished by a rerun.
func TestResize(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	ctx := context.Background()

	t.Run("clear in bounded chunks", func(t *testing.T) {
		for _, tc := range []struct {
			keys, page, chunks int
		}{
			{keys: 2300, page: 500, chunks: 5},
			{keys: 1000, page: 500, chunks: 2},
			{keys: 7, page: 500, chunks: 1},
			{keys: 0, page: 500, chunks: 0},
		} {
			t.Run(fmt.Sprintf("%d keys by %d", tc.keys, tc.page), func(t *testing.T) {
				prefix := fmt.Sprintf("/reshard/clear/%d-%d/", tc.keys, tc.page)
				p := keys.ResizeStaging(prefix)
				putMany(t, cli, p, tc.keys)
				// Neighbours of the prefix, which no range may reach.
				outside := []string{prefix + "resize/stagin", prefix + "resize/staging0", prefix + "state/00"}
				for _, k := range outside {
					if _, err := cli.Put(ctx, k, "keep"); err != nil {
						t.Fatal(err)
					}
				}
				r := &resize{cli: cli, prefix: prefix, o: Options{StepTimeout: 10 * time.Second}, fence: lockFence(t, cli, prefix), page: tc.page}
				before, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
				if err != nil {
					t.Fatal(err)
				}
				chunks, err := r.clear(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				if chunks != tc.chunks {
					t.Errorf("%d deletes, want %d", chunks, tc.chunks)
				}
				// Each delete is one revision: its events say how many keys
				// each request removed.
				perRev := map[int64]int{}
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				wch := cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(before.Header.Revision+1))
				for seen := 0; seen < tc.keys; {
					resp := <-wch
					if err := resp.Err(); err != nil {
						t.Fatal(err)
					}
					for _, ev := range resp.Events {
						if ev.Type != clientv3.EventTypeDelete {
							t.Fatalf("event %v on %s", ev.Type, ev.Kv.Key)
						}
						perRev[ev.Kv.ModRevision]++
						seen++
					}
				}
				if len(perRev) != tc.chunks {
					t.Errorf("deletes at %d revisions, want %d", len(perRev), tc.chunks)
				}
				for rev, n := range perRev {
					if n > tc.page {
						t.Errorf("the delete at revision %d removed %d keys, more than a page of %d", rev, n, tc.page)
					}
				}
				if left, _ := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly()); left.Count != 0 {
					t.Errorf("%d keys left under %s", left.Count, p)
				}
				for _, k := range outside {
					if resp, _ := cli.Get(ctx, k); len(resp.Kvs) != 1 {
						t.Errorf("%s was deleted: it is not under %s", k, p)
					}
				}
			})
		}
	})

	t.Run("a clear without the lock deletes nothing", func(t *testing.T) {
		prefix := "/reshard/unfenced/"
		p := keys.ResizeStaging(prefix)
		putMany(t, cli, p, 50)
		fence := lockFence(t, cli, prefix)
		if _, err := cli.Delete(ctx, fence.Key); err != nil { // the lease expired
			t.Fatal(err)
		}
		r := &resize{cli: cli, prefix: prefix, o: Options{StepTimeout: 10 * time.Second}, fence: fence, page: 20}
		if _, err := r.clear(ctx, p); err == nil {
			t.Fatal("a clear without the lock succeeded")
		}
		if left, _ := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly()); left.Count != 50 {
			t.Errorf("%d keys left, want all 50", left.Count)
		}
	})

	t.Run("a rerun finishes a resize killed after writing", func(t *testing.T) {
		prefix := "/reshard/resume/"
		const from, to, n = 4, 8, 300
		want := map[string]time.Time{}
		tables := make([]*store.Table, from)
		for i := range tables {
			tables[i] = store.NewTable()
		}
		base := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
		var defs []clientv3.Op
		for i := range n {
			name := "tenant-" + strconv.Itoa(i)
			want[name] = base.Add(time.Duration(i) * time.Second)
			tables[keys.ShardOf(name, from)].Set(store.EntryState{Name: name, LastSlot: want[name]})
			defs = append(defs, clientv3.OpPut(keys.Defs(keys.Shard(prefix, keys.ShardOf(name, from), from))+name, `{"task":"t","every":"1m"}`))
		}
		g := lockFence(t, cli, "/reshard/resume-writer/")
		for i, tb := range tables {
			tb.Fit()
			if err := store.New(cli, keys.Shard(prefix, i, from)).Save(ctx, g, tb, nil); err != nil {
				t.Fatal(err)
			}
		}
		for len(defs) > 0 {
			k := min(len(defs), 100)
			if _, err := cli.Txn(ctx).Then(defs[:k]...).Commit(); err != nil {
				t.Fatal(err)
			}
			defs = defs[k:]
		}
		if _, err := cli.Put(ctx, keys.ShardCount(prefix), strconv.Itoa(from)); err != nil {
			t.Fatal(err)
		}

		o := Options{Client: cli, Prefix: prefix, To: to, By: "test", StopAfter: "written"}
		if _, err := Resize(ctx, o); err == nil {
			t.Fatal("a resize stopped after writing reported success")
		}
		if err := CheckNotResizing(ctx, cli, prefix); err == nil {
			t.Error("a replica may start on a resize killed while it deletes its staging copies")
		}
		if resp, _ := cli.Get(ctx, keys.ResizeStaging(prefix), clientv3.WithPrefix(), clientv3.WithCountOnly()); resp.Count == 0 {
			t.Fatal("the staging copies are gone before the count is written")
		}
		// The killed resize's lock lives on its lease; its expiry is
		// what a rerun waits for.
		lock, err := cli.Get(ctx, keys.ResizeLock(prefix))
		if err != nil || len(lock.Kvs) != 1 {
			t.Fatalf("the lock: %v %v", lock, err)
		}
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(lock.Kvs[0].Lease)); err != nil {
			t.Fatal(err)
		}
		o.StopAfter = ""
		res, err := Resize(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Resumed || res.From != from || res.To != to {
			t.Errorf("rerun: %+v, want a resumed resize from %d to %d", res, from, to)
		}
		if c, recorded, err := ReadCount(ctx, cli, prefix); err != nil || !recorded || c != to {
			t.Errorf("count %d (recorded %v, %v), want %d", c, recorded, err, to)
		}
		if resp, _ := cli.Get(ctx, keys.Resize(prefix), clientv3.WithPrefix(), clientv3.WithCountOnly()); resp.Count != 0 {
			t.Errorf("%d keys left under %s", resp.Count, keys.Resize(prefix))
		}
		got, gotDefs := 0, 0
		for i := range to {
			sp := keys.Shard(prefix, i, to)
			tb, err := store.New(cli, sp).Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tb.Range(func(st store.EntryState) bool {
				got++
				if keys.ShardOf(st.Name, to) != i || !st.LastSlot.Equal(want[st.Name]) {
					t.Errorf("shard %d of %d holds %s at %v, want shard %d at %v", i, to, st.Name, st.LastSlot, keys.ShardOf(st.Name, to), want[st.Name])
				}
				return true
			})
			d, err := cli.Get(ctx, keys.Defs(sp), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			gotDefs += len(d.Kvs)
			for _, kv := range d.Kvs {
				name := string(kv.Key[len(keys.Defs(sp)):])
				if keys.ShardOf(name, to) != i {
					t.Errorf("%s's definition is in shard %d of %d", name, i, to)
				}
			}
		}
		if got != n {
			t.Errorf("%d states after the resize, want %d", got, n)
		}
		if gotDefs != n {
			t.Errorf("%d definitions after the resize, want %d", gotDefs, n)
		}
	})
}

// putMany writes n keys under p, in transactions of 100.
func putMany(t *testing.T, cli *clientv3.Client, p string, n int) {
	t.Helper()
	var ops []clientv3.Op
	for i := range n {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sk%06d", p, i), "v"))
	}
	for len(ops) > 0 {
		k := min(len(ops), 100)
		if _, err := cli.Txn(context.Background()).Then(ops[:k]...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[k:]
	}
}

// lockFence writes a key standing for a resize's lock and returns its
// fence.
func lockFence(t *testing.T, cli *clientv3.Client, prefix string) election.Fence {
	t.Helper()
	key := keys.ResizeLock(prefix)
	resp, err := cli.Put(context.Background(), key, "test")
	if err != nil {
		t.Fatal(err)
	}
	return election.Fence{Key: key, Token: resp.Header.Revision}
}
