package etcdscan

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// etcd is the package's one embedded etcd: each test uses keys of its own.
var etcd struct {
	sync.Once
	dir  string
	eps  []string
	stop func()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if etcd.stop != nil {
		etcd.stop()
	}
	os.RemoveAll(etcd.dir)
	os.Exit(code)
}

func newClient(t *testing.T) *clientv3.Client {
	t.Helper()
	etcd.Do(func() {
		dir, err := os.MkdirTemp("", "etcdscan-test")
		if err != nil {
			panic(err)
		}
		srv, err := embedetcd.Start(embedetcd.Config{Dir: dir})
		if err != nil {
			panic(err)
		}
		etcd.dir, etcd.eps, etcd.stop = dir, srv.Endpoints, srv.Close
	})
	return testutil.NewEtcdClient(t, etcd.eps...)
}

// TestPrefixPagesOneSnapshot: a prefix read in pages sees every key once,
// in order, and nothing written after its first page.
// clearPrefix deletes what an earlier run (-count) left under prefix in the
// package's one etcd.
func clearPrefix(t *testing.T, cli *clientv3.Client, prefix string) {
	t.Helper()
	if _, err := cli.Delete(context.Background(), prefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
}

func TestPrefixPagesOneSnapshot(t *testing.T) {
	cli := newClient(t)
	ctx := context.Background()
	clearPrefix(t, cli, "/p/")
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

// TestPrefixesOneSnapshot: many small prefixes (more than one
// transaction's worth) are read alone, the keys beside them never, and
// every batch at the first one's revision.
func TestPrefixesOneSnapshot(t *testing.T) {
	cli := newClient(t)
	ctx := context.Background()
	clearPrefix(t, cli, "/s/")
	const n = ReadBatch + 5
	prefixes := make([]string, n)
	for i := range n {
		prefixes[i] = fmt.Sprintf("/s/%d/leader/", i)
		for j := range i % 3 {
			if _, err := cli.Put(ctx, fmt.Sprintf("%sc%d", prefixes[i], j), "v1"); err != nil {
				t.Fatal(err)
			}
		}
		// Beside each election: what a shard's state and definitions are.
		if _, err := cli.Put(ctx, fmt.Sprintf("/s/%d/defs/x", i), "big"); err != nil {
			t.Fatal(err)
		}
	}
	got := map[int][]string{}
	calls := 0
	_, err := Prefixes(ctx, cli, prefixes, func(i int, kvs []*mvccpb.KeyValue) {
		calls++
		if calls == 1 { // before the second batch is read
			if _, err := cli.Put(ctx, prefixes[n-1]+"late", "v2"); err != nil {
				t.Error(err)
			}
		}
		for _, kv := range kvs {
			got[i] = append(got[i], string(kv.Key))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != n {
		t.Errorf("fn called %d times, want once per prefix (%d)", calls, n)
	}
	for i := range n {
		if len(got[i]) != i%3 {
			t.Errorf("prefix %d: read %v, want its %d keys alone (none written after the first batch)", i, got[i], i%3)
		}
		for _, k := range got[i] {
			if !strings.HasPrefix(k, prefixes[i]) {
				t.Errorf("prefix %d: read %s", i, k)
			}
		}
	}
}
