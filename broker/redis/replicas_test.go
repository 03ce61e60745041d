package redis

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
)

// TestMinReplicas shows, on a real master and replica, what a failover
// does to a publish the replica never received, with and without WAIT.
// The replica is detached with REPLICAOF NO ONE, the first step of every
// promotion (Sentinel sends exactly that); the master still accepts
// writes, as a master does until Sentinel reconfigures it.
func TestMinReplicas(t *testing.T) {
	task := compileTest(t, "    {task: tasks.add, every: 1s, args: [1, 2]}")
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		minReplicas int
		wantFirst   broker.Result // the publish while the replica is detached
		wantOnNew   int64         // messages for the slot on the promoted replica after the retry loop
	}{
		// Without WAIT the master acknowledges, the caller records the slot
		// as done and never publishes it again: the promoted replica has no
		// message. This is the silent miss.
		{"without WAIT the slot is lost", 0, broker.ResultOK, 0},
		// With WAIT the shortfall leaves the slot pending; the retry after
		// the failover publishes it on the new master.
		{"with WAIT 1 the slot stays pending", 1, broker.ResultError, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			master := testutil.MustStartRedis(t)
			replica := testutil.MustStartReplica(t, master.Addr())
			shortfalls := prometheus.NewCounter(prometheus.CounterOpts{Name: "shortfalls"})
			opts := Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", MinReplicas: tc.minReplicas,
				MinReplicasTimeout: 300 * time.Millisecond, ReplicaShortfalls: shortfalls}
			p := New(master.Client(), opts)
			// The replica may still be in its first full sync: WAIT
			// counts it only once it follows.
			testutil.EventuallyErr(t, 15*time.Second, 50*time.Millisecond, "the fence with the replica following",
				func() error { return p.RaiseFence(ctx, 10) })
			before := promtest.ToFloat64(shortfalls) // the sync's, if any
			// While the replica follows, a publish counts.
			res := make([]broker.Result, 1)
			if err := p.Publish(ctx, 10, []celery.Fire{{Task: task, Slot: slot.Add(-time.Second)}}, res); err != nil || res[0] != broker.ResultOK {
				t.Fatalf("publish with the replica attached: %v %v", res, err)
			}
			newMaster := redis.NewClient(&redis.Options{Addr: replica.Addr()})
			defer newMaster.Close()
			// Without WAIT nothing says the replica has it yet: wait, so the
			// only write the failover can lose is the next one.
			testutil.EventuallyEvery(t, 10*time.Second, 10*time.Millisecond, "the replica to receive the first publish",
				func() bool { return newMaster.LLen(ctx, "celery").Val() == 1 })
			if err := newMaster.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
				t.Fatal(err)
			}
			err := p.Publish(ctx, 10, []celery.Fire{{Task: task, Slot: slot}}, res)
			if res[0] != tc.wantFirst {
				t.Fatalf("publish to the abandoned master: %v, want %v (err %v)", res[0], tc.wantFirst, err)
			}
			if tc.minReplicas > 0 {
				if !errors.Is(err, ErrReplicaShortfall) {
					t.Fatalf("err = %v, want ErrReplicaShortfall", err)
				}
				if got := promtest.ToFloat64(shortfalls) - before; got != 1 {
					t.Fatalf("shortfalls = %v, want 1", got)
				}
				// Retrying on the old master finds the dedup key (a duplicate)
				// but still no replica: still pending, not done.
				if err := p.Publish(ctx, 10, []celery.Fire{{Task: task, Slot: slot}}, res); res[0] != broker.ResultError || !errors.Is(err, ErrReplicaShortfall) {
					t.Fatalf("retry on the old master: %v %v", res[0], err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			// The failover completes: beatd's client now reaches the
			// promoted replica. A pending slot is published there.
			onNew := New(newMaster, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
			if res[0] != broker.ResultOK && res[0] != broker.ResultDuplicate {
				if err := onNew.Publish(ctx, 10, []celery.Fire{{Task: task, Slot: slot}}, res); err != nil || res[0] != broker.ResultOK {
					t.Fatalf("retry on the new master: %v %v", res[0], err)
				}
			}
			mark := markOf(t, newMaster, onNew, task.Name)
			if got := mark == strconv.FormatInt(slot.UnixMicro(), 10); got != (tc.wantOnNew == 1) {
				t.Fatalf("slot on the new master: marked %v (mark %q), want %v", got, mark, tc.wantOnNew == 1)
			}
			if got := newMaster.LLen(ctx, "celery").Val(); got != 1+tc.wantOnNew {
				t.Fatalf("new master's queue: %d messages, want %d", got, 1+tc.wantOnNew)
			}
		})
	}
}

// TestMinReplicasAuto: the Sentinel default waits for one replica while
// the master has one online; when it loses it, it goes on waiting for the
// grace (a failover's old master: what it took alone would be discarded),
// and only after it publishes to the master alone.
func TestMinReplicasAuto(t *testing.T) {
	ctx := context.Background()
	master := testutil.MustStartRedis(t)
	replica := testutil.MustStartReplica(t, master.Addr())
	const grace = 3 * time.Second
	// The re-count's period and the grace run on a fake clock: the test
	// moves it past each instead of sleeping through it.
	clock := clockwork.NewFakeClock()
	p := New(master.Client(), Options{KeyPrefix: "beatd:{test}:", MinReplicas: ReplicasAuto, MinReplicasTimeout: 300 * time.Millisecond,
		ReplicasAutoGrace: grace, Clock: clock})
	if err := p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.MinReplicas(ctx); got != 1 {
		t.Fatalf("with a replica online: waits for %d, want 1", got)
	}
	// The replica is gone from the moment Kill starts (the master sees
	// its link drop before Kill has reaped it), so the grace is measured
	// from then.
	lost := clock.Now()
	replica.Kill()
	task := compileTest(t, "    {task: tasks.add, every: 1s}")
	res := make([]broker.Result, 1)
	// Within the grace the publish waits for a replica, and falls short.
	clock.Advance(autoRecheck) // past autoRecheck: the loss is counted
	if err := p.Publish(ctx, 1, []celery.Fire{{Task: task, Slot: time.Unix(0, 0)}}, res); clock.Since(lost) < grace && (err == nil || res[0] == broker.ResultOK) {
		t.Fatalf("publish %s after the master lost its replica: %v %v, want a shortfall", clock.Since(lost), res, err)
	}
	testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "auto to stop waiting for the dead replica after the grace",
		func() bool {
			if p.MinReplicas(ctx) == 0 {
				return true
			}
			clock.Advance(100 * time.Millisecond)
			return false
		})
	if since := clock.Since(lost); since < grace {
		t.Errorf("auto stopped waiting %s after the loss, before its grace %s", since, grace)
	}
	// A later slot (the first one's push, short of replicas, is in
	// Redis: a retry of it is a duplicate).
	if err := p.Publish(ctx, 1, []celery.Fire{{Task: task, Slot: time.Unix(1, 0)}}, res); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("publish with no replica past the grace: %v %v", res, err)
	}
}
