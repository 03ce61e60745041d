package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/harness"
)

// readSQS takes every message out of the emulator's queue and returns the
// beatd ones (Kombu's envelope, base64, as beatd sends it).
func readSQS(t *testing.T, e *harness.SQS, queue string) []chaos.Message {
	t.Helper()
	bodies, err := e.Drain(context.Background(), queue)
	if err != nil {
		t.Fatal(err)
	}
	var out []chaos.Message
	for _, body := range bodies {
		raw, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			t.Fatal(err)
		}
		var env struct {
			Headers struct {
				ID    string `json:"id"`
				Entry string `json:"beat_entry"`
				Slot  string `json:"beat_slot"`
				Token int64  `json:"beat_fencing_token"`
			} `json:"headers"`
		}
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatal(err)
		}
		slot, err := time.Parse(time.RFC3339Nano, env.Headers.Slot)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, chaos.Message{Entry: env.Headers.Entry, Slot: slot, Token: env.Headers.Token, TaskID: env.Headers.ID})
	}
	return out
}

// TestProcessSQSFailover runs two beatd processes on the SQS emulator
// through a kill -9 of the leader, a SIGSTOP of the leader past the lease
// TTL and a SIGTERM handover, then drains both queues and audits slot by slot: none missed
// on either; on the standard queue a duplicate only where a re-send was
// logged, on the .fifo queue none. (The emulator keeps a FIFO dedup
// record until the message is deleted, and nothing is deleted before the
// audit; SQS keeps it 5 minutes. So this proves beatd re-sends with the
// slot's dedup id, not SQS's window.)
func TestProcessSQSFailover(t *testing.T) {
	// Its own emulator, Redis and etcd, and mostly scenario sleeps; the
	// audit judges it, as TestProcessAMQPFailover's does.
	t.Parallel()
	if testing.Short() {
		t.Skip("runs beatd processes and the SQS emulator")
	}
	e, err := harness.StartSQS(filepath.Join(t.TempDir(), "sqs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	// The emulator checks no credentials; the AWS chain must yield some.
	awsEnv := []string{"AWS_ACCESS_KEY_ID=beatd-test", "AWS_SECRET_ACCESS_KEY=beatd-test", "AWS_EC2_METADATA_DISABLED=true"}
	yamlText := `entries:
  std: {task: tasks.add, every: 1s, catchup: all, args: [1, 2], options: {queue: proc}}
  std2: {task: tasks.add, every: 1s, catchup: all, args: [3, 4], options: {queue: proc}}
  fifo: {task: tasks.add, every: 1s, catchup: all, args: [5, 6], options: {queue: proc.fifo}}
`
	c := newClusterEnv(t, yamlText, awsEnv, 2, "--broker", e.BrokerURL())
	lead, _ := c.leader("", 30*time.Second)
	from := time.Now().Truncate(time.Second).Add(2 * time.Second)
	time.Sleep(3 * time.Second) // the scenario: three seconds of slots before the first fault

	lead.Kill()
	c.leader(lead.ID, 30*time.Second)
	time.Sleep(2 * time.Second) // the scenario: the new leader alone for two seconds
	lead.start()

	cur, _ := c.leader("", 30*time.Second)
	cur.Signal(syscall.SIGSTOP)
	c.leader(cur.ID, 30*time.Second)
	time.Sleep(3 * time.Second) // the scenario: frozen past the TTL, then woken
	cur.Signal(syscall.SIGCONT)
	time.Sleep(2 * time.Second) // the scenario: two seconds after the wake-up

	cur, _ = c.leader("", 30*time.Second)
	cur.Signal(syscall.SIGTERM) // a handover: finish the batch, persist, resign
	c.leader(cur.ID, 30*time.Second)
	<-cur.Done()
	cur.start()
	time.Sleep(3 * time.Second) // the scenario: three seconds after the handover, audited
	to := time.Now().Add(-1500 * time.Millisecond)
	c.stopAll()

	cfg, err := config.LoadFile(c.config)
	if err != nil {
		t.Fatal(err)
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
	std := append(readSQS(t, e, "proc"), readSQS(t, e, "proc.fifo")...)
	rep := chaos.Audit(cfg, std, from, to)
	if len(rep.Missed) > 0 {
		t.Errorf("missed slots: %v", rep.Missed)
	}
	for _, d := range rep.Duplicates {
		if d.Entry == "fifo" {
			t.Errorf("duplicate on the .fifo queue: %s %s x%d", d.Entry, d.Slot, d.Count)
		}
		if !resent[d.Entry+" "+d.Slot.UTC().Format(time.RFC3339Nano)] {
			t.Errorf("duplicate %s %s x%d without a logged re-send", d.Entry, d.Slot, d.Count)
		}
	}
	if rep.ExpectedSlots < 30 {
		t.Errorf("only %d slots audited", rep.ExpectedSlots)
	}
	t.Logf("%d messages, %d expected slots, %d duplicates (all logged re-sends), %d re-sends logged",
		len(std), rep.ExpectedSlots, len(rep.Duplicates), len(resent))
}
