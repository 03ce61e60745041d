package shardsim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestShardedFailover: 3 replicas share 8 shards of 64 entries firing
// every second (catchup: all, so every slot is owed); each ends up leading
// its share. One is killed as kill -9 does; the other two take its shards
// after the TTL. Every slot of every entry from before the kill to the
// end is in the queue exactly once.
func TestShardedFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, Redis and three simulated replicas for ~20 s")
	}
	const shards, entries = 8, 64
	var y strings.Builder
	y.WriteString("entries:\n")
	for i := range entries {
		fmt.Fprintf(&y, "  tenant-%03d: {task: tasks.t, every: 1s, catchup: all, args: [%d]}\n", i, i)
	}
	cfg, err := config.Parse("sim.yaml", []byte(y.String()))
	if err != nil {
		t.Fatal(err)
	}
	rs := testutil.MustStartRedis(t)
	c := &Cluster{Etcd: testutil.MustStartEmbeddedEtcd(t).Endpoints, Redis: rs.Addr(), Prefix: "/beatd/sim/", Shards: shards, TTL: 3 * time.Second, Config: cfg}
	var reps []*Replica
	for _, id := range []string{"a", "b", "c"} {
		r, err := c.Start(id)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
	}
	t.Cleanup(func() {
		for _, r := range reps {
			r.Stop()
		}
	})
	// settle bounds a rebalance by the cluster's own periods, not by a
	// wall time that load stretches: a TTL for a registration to show
	// (or a dead replica's leases to expire), the longest campaign
	// backoff (leader's campaignBackoffMax, 5 s: a campaign a loaded etcd
	// failed retries within it), and a balance period for every move,
	// at most one per candidate (shards x replicas, each move can land on
	// a replica that queued before it reached its share and must pass it
	// on); doubled for -race on two loaded cores. The wait ends as soon
	// as the shares hold, so it costs wall time only when they never do.
	settle := 2 * (c.TTL + 5*time.Second + time.Duration(shards*len(reps))*c.Interval)
	// Balanced: 3, 3 and 2 of 8 (in some order).
	start := time.Now()
	testutil.EventuallyErr(t, settle, 100*time.Millisecond, "a share of 2–3 shards each", func() error {
		a, b, cc := reps[0].Held(), reps[1].Held(), reps[2].Held()
		if a+b+cc == shards && max(a, b, cc) <= 3 && min(a, b, cc) >= 2 {
			return nil
		}
		return fmt.Errorf("shards held %d/%d/%d, shares %d/%d/%d", a, b, cc, reps[0].share(), reps[1].share(), reps[2].share())
	})
	t.Logf("the replicas reached their shares %s after they started (bound %s)", time.Since(start).Round(10*time.Millisecond), settle)
	from := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(3 * time.Second) // an observation window: three seconds of slots before the kill
	victim := reps[2]
	lost := victim.Held()
	killed := time.Now()
	victim.Kill()
	reps = reps[:2]
	testutil.EventuallyErr(t, settle, 50*time.Millisecond, "the survivors to take every shard after the kill", func() error {
		if a, b := reps[0].Held(), reps[1].Held(); a+b != shards {
			return fmt.Errorf("the survivors hold %d+%d of %d shards", a, b, shards)
		}
		return nil
	})
	t.Logf("the survivors took the killed replica's %d shards %s after the kill (TTL %s, bound %s)", lost, time.Since(killed).Round(10*time.Millisecond), c.TTL, settle)
	// An observation window: four seconds of slots after the takeover.
	time.Sleep(4 * time.Second)
	to := time.Now().Truncate(time.Second)
	// Every slot to here is owed (catchup: all), but a leader on loaded
	// cores may still be catching up on its last few: wait, within the
	// settle bound, until every one is in the queue; a slot published
	// twice fails at once, since nothing can take it back.
	var slots int
	var dups []string
	testutil.EventuallyErr(t, settle, 200*time.Millisecond, "every slot in the queue exactly once", func() error {
		msgs, err := chaos.ReadQueue(context.Background(), rs.Client(), "celery")
		if err != nil {
			return err
		}
		got := map[string]int{}
		for _, m := range msgs {
			got[m.Entry+"@"+strconv.FormatInt(m.Slot.Unix(), 10)]++
		}
		var missed []string
		slots, dups = 0, nil
		for _, e := range cfg.Entries {
			for s := from; !s.After(to); s = s.Add(time.Second) {
				slots++
				switch n := got[e.Name+"@"+strconv.FormatInt(s.Unix(), 10)]; {
				case n == 0:
					missed = append(missed, fmt.Sprintf("%s at %s (shard %d)", e.Name, s.Format(time.TimeOnly), ShardOf(e.Name, shards)))
				case n > 1:
					dups = append(dups, fmt.Sprintf("%s at %s published %d times", e.Name, s.Format(time.TimeOnly), n))
				}
			}
		}
		if len(dups) > 0 {
			return fmt.Errorf("%w: %d of %d slots published more than once, e.g. %s", harness.ErrGaveUp, len(dups), slots, dups[0])
		}
		if len(missed) > 0 {
			return fmt.Errorf("%d of %d slots missing, e.g. %s", len(missed), slots, missed[0])
		}
		return nil
	})
	t.Logf("audited %d slots of %d entries in %d shards from %s to %s: every one published once", slots, entries, shards,
		from.Format(time.TimeOnly), to.Format(time.TimeOnly))
}
