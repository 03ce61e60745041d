package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/testkit/testutil"
)

// logEvent is one JSON log line of a replica: its message, shard and
// time.
type logEvent struct {
	Time  time.Time `json:"time"`
	Msg   string    `json:"msg"`
	Shard *int      `json:"shard"`
}

// logEvents are the lines of log with message msg, by shard.
func logEvents(t *testing.T, log, msg string) map[int][]time.Time {
	t.Helper()
	out := map[int][]time.Time{}
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e logEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Msg == msg && e.Shard != nil {
			out[*e.Shard] = append(out[*e.Shard], e.Time)
		}
	}
	return out
}

// TestShardMoveReady: a replica that joins loads the entries of each
// shard it is owed before it campaigns for it, so the old leader hands a
// shard over only to a replica ready to schedule it; and it loads the
// entries of no shard but those (a joiner that queued for every shard
// would load the whole cluster). A replica that stops hands each of its
// shards over the same way before it exits.
func TestShardMoveReady(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two beatd replicas with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte("entries:\n  e0: {task: tasks.t, every: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(id string, log *testutil.SyncBuffer) *Main {
		m := newTestMain(log, log)
		if err := m.ParseFlags(context.Background(), []string{"--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","),
			"--prefix", "/move/", "--id", id, "--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s",
			"--state-interval", "200ms", "--shards", "4"}); err != nil {
			t.Fatal(err)
		}
		if err := m.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	var alog, blog testutil.SyncBuffer
	a := start("a", &alog)
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a leads all 4 shards", func() bool { return len(a.shards.leading()) == 4 })
	var docs []sources.Doc
	for i := range 400 {
		docs = append(docs, sources.Doc{Name: fmt.Sprintf("r%03d", i), Data: []byte(`{"task": "tasks.t", "every": "1h"}`)})
	}
	for chunk := range slices.Chunk(docs, 100) { // etcd's txn ops limit
		if _, err := a.entries.Put(context.Background(), chunk, nil); err != nil {
			t.Fatal(err)
		}
	}
	b := start("b", &blog)
	testutil.EventuallyEvery(t, 20*time.Second, 50*time.Millisecond, "a and b lead 2 shards each", func() bool {
		return len(a.shards.leading()) == 2 && len(b.shards.leading()) == 2
	})
	handed := logEvents(t, alog.String(), "handing a shard over to a replica that leads less than its share")
	loaded := logEvents(t, blog.String(), "shard's entries loaded")
	var led []int
	for _, l := range b.shards.leading() {
		led = append(led, l.Shard)
		h, ld := handed[l.Shard], loaded[l.Shard]
		if len(h) != 1 || len(ld) != 1 {
			t.Fatalf("shard %d: a handed it over at %v, b loaded its entries at %v; want once each", l.Shard, h, ld)
		}
		if !ld[0].Before(h[0]) {
			t.Errorf("shard %d: b loaded its entries at %s, after a handed it over at %s", l.Shard, ld[0].Format(time.StampMicro), h[0].Format(time.StampMicro))
		}
	}
	for i := range loaded {
		if !slices.Contains(led, i) {
			t.Errorf("b loaded the entries of shard %d, which it does not lead (it leads %v)", i, led)
		}
	}
	// a drops a shard handed over only after b has started it, and at
	// least handoverSettle after it handed it over: the drop's CPU is not
	// the new leader's start's.
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "a's terms of the shards handed over end", func() bool {
		over := logEvents(t, alog.String(), "term over")
		for _, i := range led {
			if len(over[i]) == 0 {
				return false
			}
		}
		return true
	})
	over := logEvents(t, alog.String(), "term over")
	scheduling := logEvents(t, blog.String(), "scheduling")
	for _, i := range led {
		if len(scheduling[i]) != 1 {
			t.Fatalf("shard %d: b scheduled it at %v; want once", i, scheduling[i])
		}
		if d := over[i][0].Sub(handed[i][0]); d < handoverSettle {
			t.Errorf("shard %d: a dropped it %v after handing it over, want at least %v", i, d, handoverSettle)
		}
		if !scheduling[i][0].Before(over[i][0]) {
			t.Errorf("shard %d: a dropped it at %s, before b scheduled it at %s", i, over[i][0].Format(time.StampMicro), scheduling[i][0].Format(time.StampMicro))
		}
	}

	// A stop drains: a hands each of its shards to b once b has loaded
	// it, and only then exits.
	var left []int
	for _, l := range a.shards.leading() {
		left = append(left, l.Shard)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "b leads all 4 shards", func() bool { return len(b.shards.leading()) == 4 })
	drained := logEvents(t, alog.String(), "handing a shard over to a replica that has loaded it, to exit")
	loaded = logEvents(t, blog.String(), "shard's entries loaded")
	for _, i := range left {
		h, ld := drained[i], loaded[i]
		if len(h) != 1 || len(ld) != 1 {
			t.Fatalf("shard %d: a drained it at %v, b loaded its entries at %v; want once each", i, h, ld)
		}
		if !ld[0].Before(h[0]) {
			t.Errorf("shard %d: b loaded its entries at %s, after a handed it over to exit at %s", i, ld[0].Format(time.StampMicro), h[0].Format(time.StampMicro))
		}
	}
}

// TestShardDrainTogether: replicas stopped together (a resize's stop)
// find nobody to hand over to and exit at once, not after the drain's
// budget.
func TestShardDrainTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three beatd replicas with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	cfgPath := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(cfgPath, []byte("entries:\n  e0: {task: tasks.t, every: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var ms []*Main
	for _, id := range []string{"a", "b", "c"} {
		ms = append(ms, runMain(t, "--config", cfgPath, "--etcd-endpoints", strings.Join(srv.Endpoints, ","),
			"--prefix", "/together/", "--id", id, "--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s",
			"--state-interval", "200ms", "--shards", "6"))
	}
	testutil.EventuallyEvery(t, 20*time.Second, 50*time.Millisecond, "2 shards each", func() bool {
		for _, m := range ms {
			if len(m.shards.leading()) != 2 {
				return false
			}
		}
		return true
	})
	start := time.Now()
	done := make(chan time.Duration, len(ms))
	for _, m := range ms {
		go func() {
			_ = m.Close()
			done <- time.Since(start)
		}()
	}
	for range ms {
		if d := <-done; d > 5*time.Second {
			t.Errorf("a replica stopped with the others took %s; want well under the drain's budget (%s)", d, shardDrainBudget)
		}
	}
}
