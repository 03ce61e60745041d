package etcdscan

import (
	"context"
	"fmt"
	"testing"

	"github.com/beatd/beatd/testkit/testutil"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// TestPrefixPagesOneSnapshot: a prefix read in pages sees every key once,
// in order, and nothing written after its first page.
func TestPrefixPagesOneSnapshot(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	ctx := context.Background()
	for i := range 25 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/p/k%02d", i), "v1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "/q/outside", "x"); err != nil {
		t.Fatal(err)
	}
	var got []string
	rev, err := Prefix(ctx, cli, "/p/", 4, func(kv *mvccpb.KeyValue) {
		got = append(got, string(kv.Key)+"="+string(kv.Value))
		if len(got) == 1 { // between the first page and the rest
			if _, err := cli.Put(ctx, "/p/k20", "v2"); err != nil {
				t.Error(err)
			}
			if _, err := cli.Put(ctx, "/p/k99", "new"); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 25 {
		t.Fatalf("read %d keys, want 25: %v", len(got), got)
	}
	for i, kv := range got {
		if want := fmt.Sprintf("/p/k%02d=v1", i); kv != want {
			t.Errorf("key %d: %s, want %s (in order, as of the first page)", i, kv, want)
		}
	}
	if resp, err := cli.Get(ctx, "/p/k20"); err != nil || resp.Header.Revision <= rev {
		t.Errorf("revision read %d is not before the later writes (%v)", rev, err)
	}
}
