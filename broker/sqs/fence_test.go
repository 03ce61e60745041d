package sqs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/beatd/beatd/internal/keys"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
)

// slotsIn counts the messages in queue by their beat_slot header.
func slotsIn(t *testing.T, got []received) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, g := range got {
		raw, err := base64.StdEncoding.DecodeString(g.Body)
		if err != nil {
			t.Fatal(err)
		}
		var env struct {
			Headers map[string]any `json:"headers"`
		}
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatal(err)
		}
		out[env.Headers["beat_slot"].(string)]++
	}
	return out
}

func firesOf(task *celery.Task, base time.Time, from, to int) []celery.Fire {
	var fs []celery.Fire
	for i := from; i < to; i++ {
		fs = append(fs, celery.Fire{Task: task, Slot: base.Add(time.Duration(i) * time.Minute)})
	}
	return fs
}

// TestFailoverResolvesSendRecords is a leader killed in the middle of a
// batch, after SQS took half of it and before its done record: the next
// leader re-sends the whole batch from the intent record, counts each
// re-send, answers the slots the old term sent as duplicates when its
// scheduler fires them again, and the deposed leader can send nothing.
// Audited slot by slot: 0 missed on both kinds of queue; on a standard
// queue the duplicates are exactly the half SQS had taken, each counted;
// on a .fifo queue none, because the dedup id is the slot's. The FIFO
// case holds on the emulator only because nothing is deleted between the
// two sends (goaws erases a dedup record on delete; SQS keeps it 5
// minutes): it proves beatd re-sends with the same id, not SQS's window.
func TestFailoverResolvesSendRecords(t *testing.T) {
	e := sharedSQS(t)
	for _, tt := range []struct {
		name  string
		queue string
		fifo  bool
	}{
		{"standard", "std", false},
		{"fifo", "jobs.fifo", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			c := newCluster(t)
			prefix := uniq("f") + "-"
			q := "queue_name_prefix=" + prefix
			task := compile(t, "    {task: tasks.add, every: 1m, args: [1, 2], options: {queue: "+tt.queue+"}}")
			base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

			t1 := c.elect("a")
			s1 := c.dispatcher(e, q)
			if err := s1.RaiseFence(ctx, t1); err != nil {
				t.Fatal(err)
			}
			a := firesOf(task, base, 0, 10)
			res := make([]broker.Result, len(a))
			if err := s1.Publish(ctx, t1, a, res); err != nil {
				t.Fatal(err)
			}
			// Batch B: the intent record, then SQS takes half, then the
			// leader dies (what Publish does, stopped where kill -9 would).
			b := firesOf(task, base, 10, 30)
			var msgs []*message
			var buf []byte
			for i := range b {
				m, err := s1.message(ctx, &b[i], i, t1, time.Now(), &buf)
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, m)
			}
			s1.seq++
			rec := record{Token: t1, Seq: s1.seq, At: time.Now()}
			for _, m := range msgs {
				rec.Msgs = append(rec.Msgs, *m)
			}
			if ok, err := s1.putRecord(ctx, s1.recordKey(t1, s1.seq), rec); err != nil || !ok {
				t.Fatalf("intent record: %v %v", ok, err)
			}
			s1.send(ctx, msgs[:10])
			for _, m := range msgs[:10] {
				if m.outcome != sent {
					t.Fatalf("half of B not sent: %v", m.err)
				}
			}

			c.depose("a")
			t2 := c.elect("b")
			s2 := c.dispatcher(e, q)
			if err := s2.RaiseFence(ctx, t2); err != nil {
				t.Fatal(err)
			}
			dedup := "false"
			if tt.fifo {
				dedup = "true"
			}
			if n := testutil.ToFloat64(s2.Resends().WithLabelValues("e", dedup)); n != 20 {
				t.Errorf("re-sends counted %v (deduplicated=%s), want B's 20", n, dedup)
			}

			// The deposed leader wakes and publishes: refused, nothing sent.
			late := firesOf(task, base, 40, 41)
			lres := make([]broker.Result, 1)
			if err := s1.Publish(ctx, t1, late, lres); !errors.Is(err, broker.ErrStale) || lres[0] != broker.ResultStale {
				t.Errorf("deposed leader's publish: %v %v, want stale", lres, err)
			}
			// The new leader's scheduler fires again what its etcd state
			// does not show as sent: A and B are duplicates, C is new.
			again := firesOf(task, base, 0, 35)
			ares := make([]broker.Result, len(again))
			if err := s2.Publish(ctx, t2, again, ares); err != nil {
				t.Fatal(err)
			}
			for i, r := range ares {
				want := broker.ResultDuplicate
				if i >= 30 {
					want = broker.ResultOK
				}
				if r != want {
					t.Errorf("fire %d: %v, want %v", i, r, want)
				}
			}

			seen := slotsIn(t, drain(t, e, prefix+EntityName(tt.queue)))
			dups, missed := 0, 0
			for i := 0; i < 35; i++ {
				slot := base.Add(time.Duration(i) * time.Minute).Format(time.RFC3339Nano)
				n := seen[slot]
				if n == 0 {
					missed++
					t.Errorf("slot %d missed", i)
				}
				if n > 1 {
					dups += n - 1
					if tt.fifo || i < 10 || i >= 20 {
						t.Errorf("slot %d sent %d times", i, n)
					}
				}
			}
			if seen[base.Add(40*time.Minute).Format(time.RFC3339Nano)] != 0 {
				t.Error("the deposed leader's slot reached the queue")
			}
			want := 10
			if tt.fifo {
				want = 0
			}
			if dups != want {
				t.Errorf("%d duplicates, want %d", dups, want)
			}
			t.Logf("%s: 35 slots, %d missed, %d duplicates, %v re-sends counted", tt.name, missed, dups, testutil.ToFloat64(s2.Resends().WithLabelValues("e", dedup)))
		})
	}
}

// TestRaiseFenceRefusesAnOldTerm: a term that is not the current one
// cannot start.
func TestRaiseFenceRefusesAnOldTerm(t *testing.T) {
	e := sharedSQS(t)
	c := newCluster(t)
	t1 := c.elect("a")
	c.depose("a")
	c.elect("b")
	s := c.dispatcher(e, "")
	if err := s.RaiseFence(context.Background(), t1); !errors.Is(err, broker.ErrStale) {
		t.Fatalf("RaiseFence of a deposed term: %v, want ErrStale", err)
	}
}

// TestLargeMessagesSplitRecords: a batch whose bodies would overflow one
// etcd request takes several send records, and every message arrives.
func TestLargeMessagesSplitRecords(t *testing.T) {
	e := sharedSQS(t)
	ctx := context.Background()
	c := newCluster(t)
	prefix := uniq("big") + "-"
	s := c.dispatcher(e, "queue_name_prefix="+prefix)
	token := c.elect("a")
	if err := s.RaiseFence(ctx, token); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 80*1024) // ~220 KiB as the SQS body (args, argsrepr, two base64s)
	task := compile(t, "    {task: tasks.hello, every: 1m, kwargs: {who: "+big+"}}")
	fires := firesOf(task, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), 0, 6)
	res := make([]broker.Result, len(fires))
	if err := s.Publish(ctx, token, fires, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != broker.ResultOK {
			t.Errorf("fire %d: %v", i, r)
		}
	}
	recs, err := c.cli.Get(ctx, keys.SQSIntents(c.prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if recs.Count < 2 {
		t.Errorf("%d send records for ~1.3 MiB of bodies, want several", recs.Count)
	}
	if got := drain(t, e, prefix+"celery"); len(got) != len(fires) {
		t.Errorf("%d messages arrived, want %d", len(got), len(fires))
	}
}
