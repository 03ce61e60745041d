package election

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// These run against a real 3-member cluster of Debian's etcd binary.

func TestClusterRaftLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd cluster")
	}
	cl := testutil.MustStartEtcdCluster(t, 3)
	c := runCandidates(t, cl.Endpoints(), 3, 3*time.Second)
	_, l := c.waitLeader(t, 0, 10*time.Second)
	raft, err := cl.RaftLeader(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cl.Kill(raft)
	// Leadership survives the raft election, or is regained with a larger
	// token; either way a leader exists within the TTL plus raft's election.
	cl.WaitHealthy(10 * time.Second)
	time.Sleep(2 * time.Second) // an observation window: nothing signals that leadership did not break
	_, now := c.waitLeader(t, -1, 10*time.Second)
	if now != l && now.Token <= l.Token {
		t.Errorf("new term token %d not above %d", now.Token, l.Token)
	}
	c.stop()
	c.checkFencing(t)
}

func TestClusterQuorumLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd cluster")
	}
	cl := testutil.MustStartEtcdCluster(t, 3)
	ttl := 3 * time.Second
	c := runCandidates(t, cl.Endpoints(), 2, ttl)
	_, l := c.waitLeader(t, 0, 10*time.Second)
	st := testutil.NewEtcdClient(t, cl.Endpoints()...)

	lost := time.Now()
	cl.Kill(cl.Members[0])
	cl.Kill(cl.Members[1])
	// The surviving member, if it was raft's leader, keeps renewing
	// leases on its own until CheckQuorum deposes it, up to two election
	// timeouts (harness.EtcdFast is 500 ms) after the kill. Such a
	// renewal really extends the lease (a later raft leader extends every
	// lease again), so the replica may lead until TTL - margin after it.
	const electionTimeout = 500 * time.Millisecond
	margin := max(ttl/5, 500*time.Millisecond)                       // Config.SafetyMargin's default
	bound := 2*electionTimeout + ttl - margin + 300*time.Millisecond // timer slack under -race
	select {
	case <-l.Context().Done():
		if took := time.Since(lost); took > bound {
			t.Errorf("stepped down %s after quorum was lost, want within %s", took, bound)
		}
	case <-time.After(ttl + 2*time.Second):
		t.Fatal("leader did not step down without quorum")
	}
	// No guarded write can succeed without quorum.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := guardedPut(ctx, st, l.Fence)
	cancel()
	if err == nil {
		t.Fatal("a guarded write succeeded without quorum")
	}
	if _, cur, n := c.current(); n > 0 && cur.Context().Err() == nil {
		t.Errorf("a replica still acts as leader without quorum (token %d)", cur.Token)
	}
	cl.Start(cl.Members[0])
	cl.Start(cl.Members[1])
	cl.WaitHealthy(30 * time.Second)
	_, l2 := c.waitLeader(t, l.Token, 20*time.Second)
	if l2.Token <= l.Token {
		t.Errorf("token %d not above %d", l2.Token, l.Token)
	}
	c.stop()
	c.checkFencing(t)
}

// TestStalledLeaderStepsDownBeforeLeaseExpires blackholes the leader's
// traffic to etcd. It must give up leadership locally while its lease is
// still alive at etcd, so no successor can be elected while it still
// believes it leads.
func TestStalledLeaderStepsDownBeforeLeaseExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd cluster")
	}
	cl := testutil.MustStartEtcdCluster(t, 3)
	m := cl.Members[0]
	proxy := testutil.MustStartProxy(t, strings.TrimPrefix(m.ClientURL(), "http://"))
	ttl := 3 * time.Second
	e := newElector(t, testutil.NewEtcdClient(t, "http://"+proxy.Addr()), "stalled", ttl)
	l := campaign(t, e, 10*time.Second)
	direct := testutil.NewEtcdClient(t, cl.Endpoints()...)
	kv, err := direct.Get(context.Background(), l.Key)
	if err != nil || len(kv.Kvs) == 0 {
		all, _ := direct.Get(context.Background(), prefix, clientv3.WithPrefix())
		t.Fatalf("leader key %q: %v; under prefix: %v; ctx err %v", l.Key, err, all.Kvs, context.Cause(l.Context()))
	}
	lease := clientv3.LeaseID(kv.Kvs[0].Lease)

	time.Sleep(ttl / 2) // let a keepalive or two land: the elector's keepalives are internal, only time shows them
	proxy.Blackhole(true)
	select {
	case <-l.Context().Done():
	case <-time.After(2 * ttl):
		t.Fatal("stalled leader kept leading")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, ErrKeepaliveMissed) && !errors.Is(cause, ErrSessionLost) {
		t.Errorf("ended because %v", cause)
	}
	ttlResp, err := direct.TimeToLive(context.Background(), lease)
	if err != nil {
		t.Fatal(err)
	}
	// TimeToLive truncates to whole seconds: a lease with 0.6 s left reads
	// 0, and only an expired (revoked or unknown) lease reads -1.
	if ttlResp.TTL < 0 {
		t.Errorf("the lease had already expired at etcd (TTL %d) when the leader stepped down", ttlResp.TTL)
	}
	proxy.Blackhole(false)
	proxy.Close() // drop the wedged connections so the session can stop
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("leadership goroutines did not stop")
	}
}
