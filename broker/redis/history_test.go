package redis

import (
	"context"
	"github.com/beatd/beatd/config"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/internal/testutil"
)

// TestHistory checks the run history the publish script keeps: newest
// first, capped, counted, with manual runs flagged, and untouched by
// duplicates and stale publishes.
func TestHistory(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 5, 0, time.UTC)
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", History: 3, Now: func() time.Time { return now }})
	task := compileTest(t, "    {task: tasks.add, every: 1s}")
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	if err := p.RaiseFence(ctx, 10); err != nil {
		t.Fatal(err)
	}
	var fires []celery.Fire
	for i := range 4 {
		fires = append(fires, celery.Fire{Task: task, Slot: slot.Add(time.Duration(i) * time.Second)})
	}
	fires = append(fires, celery.Fire{Task: task, Slot: now, Manual: true})
	res := make([]broker.Result, len(fires))
	if err := p.Publish(ctx, 10, fires, res); err != nil {
		t.Fatal(err)
	}
	// Repeats are duplicates and record nothing.
	if err := p.Publish(ctx, 10, fires[:4], res[:4]); err != nil || res[0] != broker.ResultDuplicate {
		t.Fatalf("repeat: %v %v", res, err)
	}
	h, err := p.Histories(ctx, []string{task.Name, "never-fired"})
	if err != nil {
		t.Fatal(err)
	}
	got := h[task.Name]
	if got.Count != 5 || len(got.Runs) != 3 {
		t.Fatalf("history = %+v, want 5 runs counted and the newest 3 kept", got)
	}
	if r := got.Runs[0]; !r.Manual || !r.Slot.Equal(now) || r.Token != 10 || r.TaskID != string(fires[4].ID[:]) || !r.PublishedAt.Equal(now) {
		t.Errorf("newest run = %+v", r)
	}
	if r := got.Runs[2]; r.Manual || !r.Slot.Equal(slot.Add(2*time.Second)) || r.TaskID != string(fires[2].ID[:]) {
		t.Errorf("oldest kept run = %+v, want the slot at +2s", r)
	}
	if !got.LastRunAt().Equal(now) {
		t.Errorf("last run at %v", got.LastRunAt())
	}
	if _, ok := h["never-fired"]; ok {
		t.Error("an entry that never fired has a history")
	}

	// With the history off, the script records nothing and status reads
	// nothing.
	off := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{off}:", History: -1})
	if err := off.Publish(ctx, 10, fires[:1], res[:1]); err != nil || res[0] != broker.ResultOK {
		t.Fatalf("publish without history: %v %v", res[0], err)
	}
	if n := client.Exists(ctx, off.historyKey(task.Name), off.countsKey()).Val(); n != 0 {
		t.Errorf("history written while off: %d keys", n)
	}
}

func TestParseRunRejectsGarbage(t *testing.T) {
	for _, s := range []string{"", "1,2,3,4", "x,2,3,id,0", "1,2,3,id,0,extra"} {
		if _, err := parseRun([]byte(s)); err == nil {
			t.Errorf("parseRun(%q) accepted it", s)
		}
	}
}

// TestFailedPushLeavesNoMark: a fire whose queue key holds another type
// fails alone, leaves its entry's mark where it was (so its retry is not
// taken for a duplicate), and the rest of the batch goes out; the entry's
// later slot in the same batch is not attempted, so it cannot overtake it.
func TestFailedPushLeavesNoMark(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
	good := namedTask(t, "good", "{task: tasks.add, every: 1s}")
	bad := namedTask(t, "bad", "{task: tasks.add, every: 1s, options: {queue: poisoned}}")
	if err := client.Set(ctx, bad.QueueKey, "not a list", 0).Err(); err != nil {
		t.Fatal(err)
	}
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	fires := []celery.Fire{{Task: bad, Slot: slot}, {Task: good, Slot: slot}, {Task: bad, Slot: slot.Add(time.Second)}}
	res := make([]broker.Result, 3)
	err := p.Publish(ctx, 1, fires, res)
	if err == nil || res[0] != broker.ResultError || res[1] != broker.ResultOK || res[2] != broker.ResultError {
		t.Fatalf("publish = %v %v, want the poisoned entry's fires alone to fail", res, err)
	}
	if v := client.HGet(ctx, p.slotsKey(), "bad").Val(); v != "" {
		t.Fatalf("an entry that pushed nothing has the mark %q: its retry would be taken for a duplicate", v)
	}
	// Fixed, the retry pushes both, in order.
	client.Del(ctx, bad.QueueKey)
	retry := []celery.Fire{fires[0], fires[2]}
	if err := p.Publish(ctx, 1, retry, res[:2]); err != nil || res[0] != broker.ResultOK || res[1] != broker.ResultOK {
		t.Fatalf("retry after the fix: %v %v", res[:2], err)
	}
	if n := client.LLen(ctx, bad.QueueKey).Val(); n != 2 {
		t.Fatalf("poisoned queue holds %d messages after the retry, want 2", n)
	}
}

// namedTask compiles one entry called name.
func namedTask(t *testing.T, name, yaml string) *celery.Task {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte("entries:\n  "+name+": "+yaml+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	task, err := celery.Compile(cfg.Entries[0].Spec(), "beatd/test", "beatd@test", "")
	if err != nil {
		t.Fatal(err)
	}
	return task
}
