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
	"github.com/beatd/beatd/testkit/testutil"
)

// TestShardedFailover: 3 replicas share 8 shards of 64 entries firing
// every second (catchup: all, so every slot is owed); each ends up leading
// its share. One is killed as kill -9 does; the other two take its shards
// after the TTL. Every slot of every entry from before the kill to the
// end is in the queue exactly once.
func TestShardedFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, Redis and three simulated replicas for ~15 s")
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
	c := &Cluster{Etcd: testutil.MustStartEmbeddedEtcd(t).Endpoints, Redis: rs.Addr(), Prefix: "/beatd/sim/", Shards: shards, TTL: 2 * time.Second, Config: cfg}
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
	// Balanced: 3, 3 and 2 of 8 (in some order).
	testutil.EventuallyErr(t, 15*time.Second, 100*time.Millisecond, "a share of 2–3 shards each", func() error {
		a, b, cc := reps[0].Held(), reps[1].Held(), reps[2].Held()
		if a+b+cc == shards && max(a, b, cc) <= 3 && min(a, b, cc) >= 2 {
			return nil
		}
		return fmt.Errorf("shards held %d/%d/%d", a, b, cc)
	})
	from := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(3 * time.Second) // an observation window: three seconds of slots before the kill
	victim := reps[2]
	lost := victim.Held()
	killed := time.Now()
	victim.Kill()
	reps = reps[:2]
	testutil.EventuallyErr(t, 15*time.Second, 50*time.Millisecond, "the survivors to take every shard after the kill", func() error {
		if a, b := reps[0].Held(), reps[1].Held(); a+b != shards {
			return fmt.Errorf("the survivors hold %d+%d of %d shards", a, b, shards)
		}
		return nil
	})
	t.Logf("the survivors took the killed replica's %d shards %s after the kill (TTL %s)", lost, time.Since(killed).Round(10*time.Millisecond), c.TTL)
	// An observation window: four seconds of slots after the takeover.
	time.Sleep(4 * time.Second)
	to := time.Now().Truncate(time.Second).Add(-2 * time.Second) // slots up to here are out

	msgs, err := chaos.ReadQueue(context.Background(), rs.Client(), "celery")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, m := range msgs {
		got[m.Entry+"@"+strconv.FormatInt(m.Slot.Unix(), 10)]++
	}
	var slots, dups, missed int
	for _, e := range cfg.Entries {
		for s := from; !s.After(to); s = s.Add(time.Second) {
			slots++
			switch n := got[e.Name+"@"+strconv.FormatInt(s.Unix(), 10)]; {
			case n == 0:
				missed++
				if missed <= 5 {
					t.Errorf("missed %s at %s (shard %d)", e.Name, s.Format(time.RFC3339), ShardOf(e.Name, shards))
				}
			case n > 1:
				dups++
				if dups <= 5 {
					t.Errorf("%s at %s published %d times", e.Name, s.Format(time.RFC3339), n)
				}
			}
		}
	}
	t.Logf("audited %d slots of %d entries in %d shards from %s to %s: %d duplicate, %d missed", slots, entries, shards,
		from.Format(time.TimeOnly), to.Format(time.TimeOnly), dups, missed)
}
