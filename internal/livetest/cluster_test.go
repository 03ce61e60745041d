package livetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

// TestRedisCluster checks the README's hash-tag claim on a real 3-master
// cluster, and that beatd refuses a cluster at start-up.
//
// The script itself runs on a cluster when every key it touches carries
// the same hash tag (--redis-prefix and Kombu's global_keyprefix, e.g.
// "{beatd}"), and fails with CROSSSLOT otherwise. beatd still refuses
// Redis Cluster: Celery's Redis transport (Kombu) cannot consume from one,
// so nothing beatd pushed would ever run.
func TestRedisCluster(t *testing.T) {
	t.Parallel() // judges what happened, not how fast: see main_test.go
	rc, err := testutil.StartRedisCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Stop)
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	defer cc.Close()
	cfg, err := config.Parse("c.yaml", []byte("entries:\n  c: {task: tasks.tick, every: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	slot := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, redisPrefix, kombuPrefix string
		crossSlot                      bool
	}{
		{"one hash tag on every key", "{beatd}beatd:", "{beatd}", false},
		{"default prefixes", "beatd:{default}:", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task, err := celery.Compile(cfg.Entries[0].Spec(), "default", "beatd@test", tc.kombuPrefix)
			if err != nil {
				t.Fatal(err)
			}
			p := redisbroker.New(cc, redisbroker.Options{Cluster: "default", KeyPrefix: tc.redisPrefix})
			res := make([]broker.Result, 1)
			err = p.Publish(ctx, 7, []celery.Fire{{Task: task, Slot: slot}}, res)
			if tc.crossSlot {
				// The transaction's keys span slots: Redis refuses the first
				// one on another node (MOVED) or the transaction (CROSSSLOT).
				if err == nil || !(strings.Contains(err.Error(), "CROSSSLOT") || strings.Contains(err.Error(), "MOVED")) {
					t.Fatalf("publish without a shared hash tag: %v %v, want CROSSSLOT or MOVED", res[0], err)
				}
				return
			}
			if err != nil || res[0] != broker.ResultOK {
				t.Fatalf("publish with one hash tag: %v %v", res[0], err)
			}
			if err := p.Publish(ctx, 7, []celery.Fire{{Task: task, Slot: slot}}, res); err != nil || res[0] != broker.ResultDuplicate {
				t.Fatalf("repeat: %v %v", res[0], err)
			}
			if err := p.RaiseFence(ctx, 8); err != nil {
				t.Fatal(err)
			}
			err = p.Publish(ctx, 7, []celery.Fire{{Task: task, Slot: slot.Add(time.Second)}}, res)
			if !errors.Is(err, broker.ErrStale) {
				t.Fatalf("deposed token: %v %v", res[0], err)
			}
			if n := cc.LLen(ctx, "{beatd}celery").Val(); n != 1 {
				t.Fatalf("queue {beatd}celery has %d messages, want 1", n)
			}
		})
	}
	t.Run("beatd refuses a cluster node at start-up", func(t *testing.T) {
		etcd := testutil.MustStartEmbeddedEtcd(t)
		conf := writeFile(t, t.TempDir(), "schedules.yaml", "entries:\n  c: {task: tasks.tick, every: 1s}\n")
		out := failsAtStart(t, nil, "--config", conf, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","),
			"--broker", "redis://"+rc.Nodes[0].Addr()+"/0", "--redis-prefix", "{beatd}beatd:", "--broker-key-prefix", "{beatd}")
		line := firstLine(out, "beatd:")
		t.Log(line)
		if !strings.Contains(line, "Redis Cluster is not supported") || !strings.Contains(line, "broker redis://"+rc.Nodes[0].Addr()) {
			t.Fatalf("start-up error %q does not refuse the cluster by name", line)
		}
	})
}
