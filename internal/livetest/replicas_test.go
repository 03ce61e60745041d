package livetest

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestMinReplicasWhileReplicaDown is the trade-off of an explicit
// --broker-min-replicas 1 with no replica: beatd warns at start-up,
// publishes nothing that would count as done, reports not ready, counts
// shortfalls; once a replica follows the master, every slot owed since
// the start is published, late but none lost and none doubled.
func TestMinReplicasWhileReplicaDown(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	cfg := writeFile(t, t.TempDir(), "schedules.yaml",
		"entries:\n  wait-tick: {task: tasks.tick, every: 1s, catchup: all, options: {queue: waitq}}\n")
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/wait/",
		"--broker", rs.URL(0), "--broker-min-replicas", "1", "--broker-min-replicas-timeout", "300ms", "--lease-ttl", "2s", "--id", "w1")
	waitFor(t, 20*time.Second, "the start-up warning", func() bool {
		return strings.Contains(p.output(), "fewer online replicas than --broker-min-replicas")
	})
	waitFor(t, 20*time.Second, "replica shortfalls", func() bool {
		_, m := p.get("/metrics")
		return strings.Contains(m, "beatd_replica_shortfalls_total ") && !strings.Contains(m, "beatd_replica_shortfalls_total 0\n")
	})
	time.Sleep(2 * time.Second) // proves a negative: two seconds of slots, none counted as done
	if n := p.fired(); n != 0 {
		t.Fatalf("%d fires counted as done without a replica", n)
	}
	if code, body := p.get("/readyz"); code == 200 {
		t.Fatalf("/readyz is 200 while publishes fall short of replicas: %s", body)
	}
	testutil.MustStartReplica(t, rs.Addr())
	p.waitFired(8, 30*time.Second)
	p.stop()

	msgs := readMessages(t, rs.Client(), "waitq")
	var slots []time.Time
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.Slot]++
		if seen[m.Slot] == 1 {
			ts, err := time.Parse(time.RFC3339Nano, m.Slot)
			if err != nil {
				t.Fatal(err)
			}
			slots = append(slots, ts)
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	for i := 1; i < len(slots); i++ {
		if slots[i].Sub(slots[i-1]) != time.Second {
			t.Fatalf("gap in published slots after %s", slots[i-1].Format(time.RFC3339))
		}
	}
	for s, n := range seen {
		if n > 1 {
			// A shortfall leaves the message on the master, and the retry
			// finds its dedup key: the queue holds each slot once.
			t.Fatalf("slot %s is in the queue %d times", s, n)
		}
	}
	// Every slot since the election was owed while the replica was down.
	first := slots[0]
	var elected time.Time
	for _, l := range strings.Split(p.output(), "\n") {
		if strings.Contains(l, `"msg":"elected leader"`) {
			if ts, err := time.Parse(time.RFC3339Nano, strings.SplitN(strings.SplitN(l, `"time":"`, 2)[1], `"`, 2)[0]); err == nil {
				elected = ts
			}
			break
		}
	}
	if elected.IsZero() {
		t.Fatal("no election in the log")
	}
	// The first slot is the first whole second after the term began (the
	// log line comes a moment before the term's clock reading).
	if first.Sub(elected) > 1500*time.Millisecond {
		t.Fatalf("first published slot %s is more than a second after the election at %s: slots lost while waiting", first, elected)
	}
	t.Logf("%d slots published once a replica followed, from %s (elected %s)",
		len(slots), first.Format(time.RFC3339), elected.Format(time.RFC3339Nano))
}
