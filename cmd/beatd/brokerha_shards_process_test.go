package main

import (
	"context"
	"testing"
	"time"

	"github.com/beatd/beatd/status"
)

// TestProcessShardBrokerPathHandover: two replicas at --shards 4, each
// reaching Redis through its own path. A cut of one replica's path hands
// every shard it leads to the replica that reaches Redis, within
// --broker-failover-after + 1 s; the cut replica leads no shard while cut,
// and takes its share back once its path heals and its hold ends. Every
// slot is in Redis exactly once.
func TestProcessShardBrokerPathHandover(t *testing.T) {
	const failoverAfter = 2 * time.Second
	c := newCluster(t, failoverConfig, 0)
	proxies := c.startProxied(2, "--broker-failover-after", failoverAfter.String(), "--shards", "4")
	held := func() map[string]int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := status.Shards(ctx, c.observer, c.prefix)
		if err != nil || len(st) != 4 {
			return nil
		}
		out := map[string]int{}
		for _, sh := range st {
			if sh.LeaderID == "" {
				return nil
			}
			out[sh.LeaderID]++
		}
		return out
	}
	waitFor(t, 20*time.Second, "r0 and r1 leading 2 shards each", func() bool {
		h := held()
		return h["r0"] == 2 && h["r1"] == 2
	})
	start := time.Now()
	waitFor(t, 10*time.Second, "publishing", func() bool { return len(c.audit("celery")) >= 3 })

	cut := time.Now()
	proxies["r0"].Blackhole(true)
	waitFor(t, failoverAfter+10*time.Second, "r1 leading all 4 shards", func() bool { return held()["r1"] == 4 })
	took := time.Since(cut)
	t.Logf("r0 cut from Redis: r1 led its shards %s after the cut", took.Round(100*time.Millisecond))
	if took > failoverAfter+time.Second+500*time.Millisecond { // the probes' period and the registry's refresh
		t.Errorf("handover %s after the cut, want within --broker-failover-after + 1 s = %s", took, failoverAfter+time.Second)
	}
	if !logHas(c.replicas[0], "handing leadership over") {
		t.Error("no log line of the handover")
	}
	// Cut for a while: r0 leads nothing again meanwhile.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if h := held(); h != nil && h["r0"] != 0 {
			t.Fatalf("r0 leads %d shards while cut", h["r0"])
		}
		time.Sleep(100 * time.Millisecond)
	}
	proxies["r0"].Blackhole(false)
	waitFor(t, 4*failoverAfter+10*time.Second, "r0 back at its share once healed and its hold over", func() bool {
		h := held()
		return h["r0"] == 2 && h["r1"] == 2
	})
	time.Sleep(2 * time.Second)
	c.stopAll()
	c.checkExactlyOnce(c.audit("celery", "other"), start.Add(2*time.Second), time.Now().Add(-3*time.Second))
}
