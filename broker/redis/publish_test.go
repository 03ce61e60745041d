package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

func compileTest(t testing.TB, yaml string) *celery.Task {
	t.Helper()
	e := entry(t.(*testing.T), yaml)
	task, err := celery.Compile(e.Spec(), "beatd/test", "beatd@test", "")
	if err != nil {
		t.Fatal(err)
	}
	return task
}

func TestFenceAndDedup(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
	task := compileTest(t, "    {task: tasks.add, every: 1s, args: [1, 2]}")
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	res := make([]broker.Result, 2)

	if err := p.RaiseFence(ctx, 10); err != nil {
		t.Fatal(err)
	}
	fires := []celery.Fire{{Task: task, Slot: slot}, {Task: task, Slot: slot.Add(time.Second)}}
	if err := p.Publish(ctx, 10, fires, res); err != nil || res[0] != broker.ResultOK || res[1] != broker.ResultOK {
		t.Fatalf("first publish: %v %v", res, err)
	}
	// The same slots again, e.g. a new leader re-publishing after a crash
	// between publish and persist: no-ops.
	if err := p.Publish(ctx, 10, fires, res); err != nil || res[0] != broker.ResultDuplicate || res[1] != broker.ResultDuplicate {
		t.Fatalf("repeat: %v %v", res, err)
	}
	if n := client.LLen(ctx, "celery").Val(); n != 2 {
		t.Fatalf("queue has %d messages, want 2", n)
	}
	// A new leader raises the fence; the deposed one is refused and changes
	// nothing, even for a slot nobody published.
	if err := p.RaiseFence(ctx, 11); err != nil {
		t.Fatal(err)
	}
	stale := []celery.Fire{{Task: task, Slot: slot.Add(2 * time.Second)}}
	err := p.Publish(ctx, 10, stale, res[:1])
	if !errors.Is(err, broker.ErrStale) || res[0] != broker.ResultStale {
		t.Fatalf("stale publish: %v %v", res[0], err)
	}
	if n := client.LLen(ctx, "celery").Val(); n != 2 {
		t.Fatalf("stale publish changed the queue: %d messages", n)
	}
	if v := markOf(t, client, p, "e"); v != strconv.FormatInt(slot.Add(time.Second).UnixMicro(), 10) {
		t.Fatalf("stale publish moved the mark: %q", v)
	}
	if err := p.RaiseFence(ctx, 9); !errors.Is(err, broker.ErrStale) {
		t.Fatalf("lowering the fence: %v", err)
	}
	if v, _ := p.Fence(ctx); v != 11 {
		t.Fatalf("fence = %d, want 11", v)
	}
	// The new leader publishes the slot fine; a higher token also raises.
	if err := p.Publish(ctx, 12, stale, res[:1]); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("new leader: %v %v", res[0], err)
	}
	if v, _ := p.Fence(ctx); v != 12 {
		t.Fatalf("fence = %d, want 12", v)
	}
	// One key per entry, whatever it fired: no per-fire key.
	if keys := client.Keys(ctx, "beatd:{test}:*").Val(); len(keys) != 4 {
		t.Errorf("beatd's keys = %v, want the fence, slots, slots-term and e's history", keys)
	}
}

func TestTaskIDDeterministic(t *testing.T) {
	t.Parallel()
	task := compileTest(t, "    {task: tasks.add, every: 1s}")
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	// uuid.uuid5(uuid.uuid5(NAMESPACE_URL, "beatd"), "beatd/test/e/2026-11-30T10:00:00Z")
	const want = "fa365807-3346-54d4-9845-b8ac19966ebc"
	if got := task.SlotID(slot); string(got[:]) != want {
		t.Errorf("SlotID = %s, want %s", got, want)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	if a, b := task.SlotID(slot), task.SlotID(slot.In(berlin)); a != b {
		t.Error("the id depends on the slot's zone")
	}
	var m1, m2 celery.Fire
	m1.Task, m1.Manual = task, true
	m2 = m1
	task.AppendMessage(nil, &m1, 1, slot)
	task.AppendMessage(nil, &m2, 1, slot)
	if m1.ID == m2.ID || m1.ID[14] != '4' {
		t.Errorf("manual ids %s %s: want distinct uuid4s", m1.ID, m2.ID)
	}
}

// TestRedisRestartMidBatch kills Redis between batches and in the middle
// of publishing: every slot lands exactly once after retries.
func TestRedisRestartMidBatch(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
	task := compileTest(t, "    {task: tasks.add, every: 1s, args: [1, 2]}")
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	const batches, perBatch = 20, 50
	restarted := make(chan struct{})
	close(restarted)
	for b := 0; b < batches; b++ {
		fires := make([]celery.Fire, perBatch)
		for i := range fires {
			fires[i] = celery.Fire{Task: task, Slot: base.Add(time.Duration(b*perBatch+i) * time.Second)}
		}
		var failed chan struct{} // closed once a publish met the dead server
		if b == 7 || b == 13 {
			<-restarted // the previous restart owns the server until it is up
			rs.Stop()
			restarted, failed = make(chan struct{}), make(chan struct{})
			go func(failed, done chan struct{}) {
				defer close(done)
				<-failed
				rs.Start()
			}(failed, restarted)
		}
		res := make([]broker.Result, perBatch)
		testutil.EventuallyErr(t, 30*time.Second, 50*time.Millisecond, fmt.Sprintf("batch %d to publish", b), func() error {
			err := p.Publish(ctx, 5, fires, res)
			if err != nil && failed != nil {
				close(failed)
				failed = nil
			}
			return err
		})
		if failed != nil {
			t.Fatalf("batch %d published while Redis was down", b)
		}
		for i, r := range res {
			if r != broker.ResultOK && r != broker.ResultDuplicate {
				t.Fatalf("batch %d fire %d: %v", b, i, r)
			}
		}
	}
	<-restarted
	msgs := client.LRange(ctx, "celery", 0, -1).Val()
	if len(msgs) != batches*perBatch {
		t.Fatalf("queue has %d messages, want exactly %d", len(msgs), batches*perBatch)
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		var msg struct {
			Headers struct {
				ID string `json:"id"`
			} `json:"headers"`
		}
		if err := json.Unmarshal([]byte(m), &msg); err != nil {
			t.Fatal(err)
		}
		if seen[msg.Headers.ID] {
			t.Fatalf("task %s pushed twice", msg.Headers.ID)
		}
		seen[msg.Headers.ID] = true
	}
}
