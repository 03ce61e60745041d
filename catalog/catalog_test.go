package catalog

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaderKey puts a leader key under prefix and returns its guard.
func leaderKey(t *testing.T, cli *clientv3.Client, prefix string) election.Fence {
	t.Helper()
	resp, err := cli.Put(context.Background(), prefix+"leader/1", "r0")
	if err != nil {
		t.Fatal(err)
	}
	return election.Fence{Key: prefix + "leader/1", Token: resp.Header.Revision}
}

func TestPublishAndRead(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	ctx := context.Background()
	big := make([]byte, 2*ChunkSize+1000) // incompressible: three chunks
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	cfg := []byte("entries:\n  a: {task: t.a, every: 1m}\n  b: {task: t.b, cron: '0 3 * * *'}\n")

	t.Run("none yet", func(t *testing.T) {
		if _, _, err := Read(ctx, cli, "/none/"); !errors.Is(err, ErrNone) {
			t.Fatalf("Read = %v, want ErrNone", err)
		}
	})
	t.Run("round trip, chunked", func(t *testing.T) {
		p := "/chunked/"
		g := leaderKey(t, cli, p)
		if err := Publish(ctx, cli, p, g, Header{File: "s.yaml", LeaderID: "r0"}, Prepare(big)); err != nil {
			t.Fatal(err)
		}
		h, data, err := Read(ctx, cli, p)
		if err != nil || !bytes.Equal(data, big) || h.Chunks != 3 || h.LeaderID != "r0" {
			t.Fatalf("Read: %v, %d bytes, header %+v", err, len(data), h)
		}
	})
	t.Run("load parses", func(t *testing.T) {
		p := "/load/"
		g := leaderKey(t, cli, p)
		if err := Publish(ctx, cli, p, g, Header{File: "s.yaml", Entries: 2}, Prepare(cfg)); err != nil {
			t.Fatal(err)
		}
		c, h, err := Load(ctx, cli, p)
		if err != nil || len(c.Entries) != 2 || c.Entry("b") == nil || h.File != "s.yaml" {
			t.Fatalf("Load: %v %+v", err, h)
		}
	})
	t.Run("a deposed leader writes nothing", func(t *testing.T) {
		p := "/deposed/"
		g := leaderKey(t, cli, p)
		g.Token--
		if err := Publish(ctx, cli, p, g, Header{}, Prepare(cfg)); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("Publish = %v, want ErrNotLeader", err)
		}
		resp, _ := cli.Get(ctx, p+"catalog/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if resp.Count != 0 {
			t.Fatalf("%d keys written", resp.Count)
		}
	})
	t.Run("same file: header only; new file: old chunks go", func(t *testing.T) {
		p := "/rewrite/"
		g := leaderKey(t, cli, p)
		if err := Publish(ctx, cli, p, g, Header{LeaderID: "r0"}, Prepare(cfg)); err != nil {
			t.Fatal(err)
		}
		chunks := func() map[string]int64 {
			resp, err := cli.Get(ctx, p+"catalog/data/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]int64{}
			for _, kv := range resp.Kvs {
				out[string(kv.Key)] = kv.ModRevision
			}
			return out
		}
		before := chunks()
		if err := Publish(ctx, cli, p, g, Header{LeaderID: "r1", PublishedAt: time.Now()}, Prepare(cfg)); err != nil {
			t.Fatal(err)
		}
		after := chunks()
		if len(after) != 1 || len(before) != 1 {
			t.Fatalf("chunks %v -> %v", before, after)
		}
		for k, rev := range before {
			if after[k] != rev {
				t.Errorf("chunk %s rewritten for the same file", k)
			}
		}
		if h, _ := ReadHeader(ctx, cli, p); h.LeaderID != "r1" {
			t.Errorf("header not updated: %+v", h)
		}
		if err := Publish(ctx, cli, p, g, Header{}, Prepare(append(cfg, "  c: {task: t.c, every: 1h}\n"...))); err != nil {
			t.Fatal(err)
		}
		now := chunks()
		for k := range before {
			if _, ok := now[k]; ok {
				t.Errorf("old chunk %s kept", k)
			}
		}
		if c, _, err := Load(ctx, cli, p); err != nil || len(c.Entries) != 3 {
			t.Fatalf("Load after a change: %v", err)
		}
	})
}
