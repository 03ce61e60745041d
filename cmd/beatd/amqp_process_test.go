package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestProcessAMQPFailover runs two beatd processes on RabbitMQ through a
// kill -9 of the leader, a RabbitMQ kill and restart (readyz reports it),
// and a SIGSTOP of the leader past the lease TTL, then drains the queue:
// every slot once (a duplicate only where a re-send was logged), none
// missed, none enqueued by a term after a newer one.
func TestProcessAMQPFailover(t *testing.T) {
	// Its own RabbitMQ, Redis and etcd, and mostly scenario sleeps.
	t.Parallel()
	if testing.Short() {
		t.Skip("runs beatd processes and rabbitmq-server")
	}
	rb := testutil.MustStartRabbitMQ(t, t.TempDir())
	yamlText := `entries:
  a: {task: tasks.add, every: 1s, catchup: all, args: [1, 2], options: {queue: proc}}
  b: {task: tasks.add, every: 1s, catchup: all, args: [3, 4], options: {queue: proc}}
`
	c := newCluster(t, yamlText, 2, "--broker", rb.URL()+"?heartbeat=1")
	lead, _ := c.leader("", 30*time.Second)
	from := time.Now().Truncate(time.Second).Add(2 * time.Second)
	time.Sleep(3 * time.Second) // the scenario: three seconds of slots before the first fault

	lead.Kill()
	next, _ := c.leader(lead.ID, 30*time.Second)
	time.Sleep(2 * time.Second) // the scenario: the new leader alone for two seconds
	lead.start()

	rb.Kill()
	waitFor(t, 15*time.Second, "readyz to report RabbitMQ down", func() bool {
		resp, err := http.Get(next.URL("/readyz"))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	time.Sleep(time.Second) // the scenario: a second of RabbitMQ outage
	if err := rb.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "readyz after RabbitMQ restarted", func() bool {
		resp, err := http.Get(next.URL("/readyz"))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	cur, _ := c.leader("", 30*time.Second)
	cur.Signal(syscall.SIGSTOP)
	c.leader(cur.ID, 30*time.Second)
	time.Sleep(3 * time.Second) // the scenario: frozen past the TTL, then woken
	cur.Signal(syscall.SIGCONT)
	time.Sleep(3 * time.Second) // the scenario: three seconds after the wake-up, audited
	to := time.Now().Add(-1500 * time.Millisecond)
	c.stopAll()

	conn := testutil.DialRabbit(t, rb)
	msgs, err := chaos.ReadQueueAMQP(conn, "proc")
	if err != nil {
		t.Fatal(err)
	}
	if fenced := chaos.FencedPublishes(msgs); len(fenced) > 0 {
		t.Errorf("%d messages enqueued after a newer term's: %v", len(fenced), fenced)
	}
	cfg, err := config.LoadFile(c.config)
	if err != nil {
		t.Fatal(err)
	}
	rep := chaos.Audit(cfg, msgs, from, to)
	if len(rep.Missed) > 0 {
		t.Errorf("missed slots: %v", rep.Missed)
	}
	resent := map[string]bool{}
	for _, r := range c.replicas {
		f, err := os.Open(r.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l struct{ Msg, Entry, Slot string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "resend" {
				resent[l.Entry+" "+l.Slot] = true
			}
		}
		f.Close()
	}
	for _, d := range rep.Duplicates {
		if !resent[d.Entry+" "+d.Slot.UTC().Format(time.RFC3339Nano)] {
			t.Errorf("duplicate %s %s x%d without a logged re-send", d.Entry, d.Slot, d.Count)
		}
	}
	if rep.ExpectedSlots < 20 {
		t.Errorf("only %d slots audited", rep.ExpectedSlots)
	}
	t.Logf("%d messages, %d expected slots, %d duplicates (all logged re-sends), %d re-sends logged",
		len(msgs), rep.ExpectedSlots, len(rep.Duplicates), len(resent))
}
