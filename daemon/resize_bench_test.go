package daemon

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkShardResize times `beatd shards resize` of a stopped cluster
// of n entries, each with state, between 4 and 8 shards (each op is one
// resize, alternately 4 -> 8 and 8 -> 4), on an in-process etcd.
func BenchmarkShardResize(b *testing.B) {
	srv := testutil.MustStartEmbeddedEtcd(b)
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	ctx := context.Background()
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			prefix := fmt.Sprintf("/bench%d/", n)
			// The seed's writes are fenced by a key of the benchmark's
			// own, as a leader's are by its election key.
			put, err := cli.Put(ctx, prefix+"seed-fence", "")
			if err != nil {
				b.Fatal(err)
			}
			fence := election.Fence{Key: prefix + "seed-fence", Token: put.Header.Revision}
			tables := make([]*store.Table, 4)
			for i := range tables {
				tables[i] = store.NewTable()
			}
			slot := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
			for e := range n {
				name := fmt.Sprintf("tenant-%07d", e)
				tables[keys.ShardOf(name, 4)].Set(store.EntryState{Name: name, LastSlot: slot, Since: slot.Add(-time.Hour)})
			}
			for i, t := range tables {
				t.Fit()
				if err := store.New(cli, keys.Shard(prefix, i, 4)).Save(ctx, fence, t, nil); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := cli.Put(ctx, keys.ShardCount(prefix), "4"); err != nil {
				b.Fatal(err)
			}
			if _, err := cli.Delete(ctx, fence.Key); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				to := 8
				if i%2 == 1 {
					to = 4
				}
				res, err := reshard.Resize(ctx, reshard.Options{Client: cli, Prefix: prefix, To: to, By: "bench"})
				if err != nil || res.Entries != n {
					b.Fatalf("resize to %d: %+v, %v", to, res, err)
				}
			}
		})
	}
}
