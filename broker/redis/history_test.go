package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"
)

// TestHistory checks the run history the publish script keeps: newest
// first, capped, counted, with manual runs flagged, and untouched by
// duplicates and stale publishes.
func TestHistory(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 10, 0, 5, 0, time.UTC)
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", History: 3, Clock: clockwork.NewFakeClockAt(now)})
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

	// With the history off, the list keeps only the newest record or
	// two (it is the entry's mark), and status reads nothing.
	off := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{off}:", History: -1})
	for i := range 5 {
		f := []celery.Fire{{Task: task, Slot: slot.Add(time.Duration(10+i) * time.Second)}}
		if err := off.Publish(ctx, 10, f, res[:1]); err != nil || res[0] != broker.ResultOK {
			t.Fatalf("publish without history: %v %v", res[0], err)
		}
	}
	if n := client.LLen(ctx, off.historyKey(task.Name)).Val(); n > 2 {
		t.Errorf("history kept %d records while off, want the mark's 1 or 2", n)
	}
	if h, err := off.Histories(ctx, []string{task.Name}); err != nil || len(h) != 0 {
		t.Errorf("history read while off: %v %v", h, err)
	}
}

func TestParseRunRejectsGarbage(t *testing.T) {
	p := New(nil, Options{Cluster: "beatd/test"})
	for _, s := range []string{"", "1,2,3,4", "x,2,3,id,0", "1,2,3,id,0,extra", "1 2 3", "1 x 3 4 5 0", "1 2 3 4 5 0 id extra"} {
		if _, _, err := p.parseRun("e", []byte(s)); err == nil {
			t.Errorf("parseRun(%q) accepted it", s)
		}
	}
	// Both formats read: this release's, and the previous one's.
	for _, tc := range []struct {
		rec  string
		runs int64
	}{
		{"1764496800000000 7 1764496800000000000 1764496800003000 4 0", 7},
		{" 1 1764496800000000000 1764496800003000 4 1 4b8a0f3e-0000-4000-8000-000000000000", 1},
		{"1764496800000000000,1764496800003000000,4,fa365807-3346-54d4-9845-b8ac19966ebc,0", 0},
	} {
		r, runs, err := p.parseRun("e", []byte(tc.rec))
		if err != nil || runs != tc.runs || r.Token != 4 || r.TaskID == "" || r.PublishedAt.Sub(r.Slot) != 3*time.Millisecond {
			t.Errorf("parseRun(%q) = %+v, %d, %v", tc.rec, r, runs, err)
		}
	}
}

// markOf is entry's high-water mark in Redis, "" if none.
func markOf(t *testing.T, c *goredis.Client, p *Publisher, entry string) string {
	t.Helper()
	head, err := c.LIndex(context.Background(), p.historyKey(entry), 0).Result()
	if errors.Is(err, goredis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	mark, _, _ := strings.Cut(head, " ")
	return mark
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
	if v := markOf(t, client, p, "bad"); v != "" {
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

// TestLastPublished: the newest run record of each entry, what a new
// leader adopts for overlap; an entry never published has none.
func TestLastPublished(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	ctx := context.Background()
	p := New(rs.Client(), Options{Cluster: "beatd/test", KeyPrefix: "beatd:{last}:"})
	task := compileTest(t, "    {task: tasks.add, every: 1s}")
	slot := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if err := p.RaiseFence(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fires := []celery.Fire{{Task: task, Slot: slot}, {Task: task, Slot: slot.Add(time.Second)}}
	if err := p.Publish(ctx, 1, fires, make([]broker.Result, 2)); err != nil {
		t.Fatal(err)
	}
	last, err := p.LastPublished(ctx, []string{task.Name, "never"})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := last[task.Name]
	if !ok || !r.Slot.Equal(slot.Add(time.Second)) || r.TaskID != string(fires[1].ID[:]) || r.PublishedAt.IsZero() {
		t.Errorf("last run %+v (%v)", r, ok)
	}
	if _, ok := last["never"]; ok {
		t.Error("a run for an entry never published")
	}
}
