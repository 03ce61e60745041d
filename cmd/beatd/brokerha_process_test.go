package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
)

// TestProcessBrokerOutageNoHandover: three replicas, each reaching Redis
// through its own path. A cut of every path (a broker outage) hands
// nothing over: publishing resumes under the same token, exactly once by
// the audit.
func TestProcessBrokerOutageNoHandover(t *testing.T) {
	// Its own etcd and Redis; it judges tokens, the log and the audit, and
	// times nothing on the wall clock (the handover's bound is
	// TestProcessBrokerPathHandover's, which runs alone).
	t.Parallel()
	const failoverAfter = 3 * time.Second
	c := newCluster(t, failoverConfig, 0)
	proxies := c.startProxied(3, "--broker-failover-after", failoverAfter.String())
	start := time.Now()
	lead, l1 := c.leader("", 20*time.Second)
	waitFor(t, 10*time.Second, "publishing", func() bool { return len(c.audit("celery")) >= 3 })

	// A full outage: every path cut. No handover; the same leader goes on.
	for _, p := range proxies {
		p.Blackhole(true)
	}
	time.Sleep(failoverAfter + 3*time.Second)
	for _, p := range proxies {
		p.Blackhole(false)
	}
	if _, l := c.leader("", time.Second); l.Token != l1.Token {
		t.Errorf("a broker outage seen by every replica changed the leader: token %d -> %d", l1.Token, l.Token)
	}
	healed := time.Now()
	waitFor(t, 15*time.Second, "publishing after the outage", func() bool {
		for _, m := range c.audit("celery") {
			if m.Slot.After(healed) {
				return true
			}
		}
		return false
	})
	if logHas(lead, "handing leadership over") {
		t.Error("the leader handed over during a full outage")
	}
	time.Sleep(2 * time.Second)
	c.stopAll()
	c.checkExactlyOnce(c.audit("celery", "other"), start.Add(2*time.Second), time.Now().Add(-3*time.Second))
}

// TestProcessBrokerPathHandover: three replicas, each reaching Redis
// through its own path. A cut of the leader's path alone hands leadership
// to a standby that reaches Redis within --broker-failover-after + TTL +
// 1 s, exactly once by the audit. (A cut of every path is
// TestProcessBrokerOutageNoHandover.)
func TestProcessBrokerPathHandover(t *testing.T) {
	const failoverAfter = 3 * time.Second
	c := newCluster(t, failoverConfig, 0)
	proxies := c.startProxied(3, "--broker-failover-after", failoverAfter.String())
	start := time.Now()
	lead, l1 := c.leader("", 20*time.Second)
	waitFor(t, 10*time.Second, "publishing", func() bool { return len(c.audit("celery")) >= 3 })

	// The leader's path alone: a standby takes over.
	cut := time.Now()
	proxies[lead.ID].Blackhole(true)
	next, l2 := c.leader(lead.ID, failoverAfter+10*time.Second)
	var firstFire time.Duration
	waitFor(t, failoverAfter+10*time.Second, "the first fire under the new leader", func() bool {
		for _, m := range c.audit("celery") {
			if m.Token == l2.Token {
				firstFire = time.Since(cut)
				return true
			}
		}
		return false
	})
	ttl := 2 * time.Second
	t.Logf("leader %s cut from Redis: %s led after %s, first fire under it %s after the cut (bound %s)",
		lead.ID, next.ID, time.Since(cut).Round(100*time.Millisecond), firstFire.Round(100*time.Millisecond), failoverAfter+ttl+time.Second)
	if firstFire > failoverAfter+ttl+time.Second+500*time.Millisecond { // 500 ms: the queue is polled
		t.Errorf("first fire %s after the cut, want within --broker-failover-after + TTL + 1 s = %s", firstFire, failoverAfter+ttl+time.Second)
	}
	if !logHas(lead, "handing leadership over") {
		t.Error("no log line of the handover")
	}
	if v, ok := lead.Metric(`beatd_leader_handovers_total{reason="broker_unreachable"}`); !ok || v != 1 {
		t0 := time.Now()
		resp, err := lead.Client().Get(lead.URL("/metrics"))
		var body []byte
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		t.Errorf("handover metric %v %v, want 1 (GET /metrics: %v after %s; %q)", v, ok, err, time.Since(t0), grepLines(string(body), "handover"))
	}
	// The cut lasts past the hold (and for -broker-cut in all, 30 s in
	// the scenario); the old leader must not lead again while it
	// is cut.
	time.Sleep(max(3*time.Second, *brokerCut-time.Since(cut)))
	t.Logf("the cut lasted %s", time.Since(cut).Round(100*time.Millisecond))
	if _, l := c.leader("", time.Second); l.ID == lead.ID {
		t.Errorf("the cut replica leads again")
	}
	proxies[lead.ID].Blackhole(false)
	time.Sleep(2 * time.Second)
	c.stopAll()
	msgs := c.audit("celery", "other")
	c.checkExactlyOnce(msgs, start.Add(2*time.Second), time.Now().Add(-3*time.Second))
	for _, m := range msgs {
		if m.Token == l1.Token && m.Slot.After(cut.Add(time.Second)) && !strings.HasPrefix(m.TaskID, "x") {
			t.Errorf("the cut leader published %s after the cut", m.Slot)
		}
	}
}

// brokerCut lengthens TestProcessBrokerPathHandover's cut (by default
// ~8 s: past the handover and the hold), e.g. -broker-cut 30s.
var brokerCut = flag.Duration("broker-cut", 0, "TestProcessBrokerPathHandover: how long the leader's broker path stays cut in all")

func grepLines(s, sub string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// startProxied starts n replicas r0…, each reaching Redis through a proxy
// of its own (which the test can cut), and waits until they serve; it
// returns the proxies by replica.
func (c *cluster) startProxied(n int, extra ...string) map[string]*harness.Proxy {
	c.t.Helper()
	proxies := map[string]*harness.Proxy{}
	for i := range n {
		p, err := harness.NewProxy(c.redis.Addr())
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(p.Close)
		id := fmt.Sprintf("r%d", i)
		proxies[id] = p
		c.startReplica(id, append([]string{"--broker", "redis://" + p.Addr() + "/0"}, extra...)...)
	}
	for _, r := range c.replicas {
		r.waitHealthy()
	}
	return proxies
}
