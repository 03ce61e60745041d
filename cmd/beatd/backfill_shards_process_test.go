package main

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/store"
)

// TestProcessShardBackfill runs a backfill on a sharded cluster: it is
// queued on the replica that does not lead the entry's shard, carried out
// by the replica that does, and, when that one is killed mid-way, finished
// by the shard's next leader. Every slot of the range is in Redis once,
// with the task id a normal fire would have had.
func TestProcessShardBackfill(t *testing.T) {
	t.Parallel()
	const shards = 4
	c := newCluster(t, "entries:\n  bf: {task: tasks.add, cron: '* * * * *', args: [1, 2], options: {queue: bf}}\n"+
		"  fast: {task: tasks.add, every: 1s, options: {queue: fast}}\n", 2, "--shards", "4")
	shard := keys.ShardOf("bf", shards)
	// leaderOf is the replica that leads bf's shard once the two replicas
	// share the shards two and two.
	leaderOf := func(not string) *replica {
		t.Helper()
		var id string
		waitFor(t, 20*time.Second, "the shards shared, and bf's led by another than "+not, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			st, err := status.Shards(ctx, c.observer, c.prefix)
			if err != nil || len(st) != shards {
				return false
			}
			held := map[string]int{}
			for _, sh := range st {
				held[sh.LeaderID]++
			}
			id = st[shard].LeaderID
			return id != "" && id != not && (not != "" || held["r0"] == 2 && held["r1"] == 2)
		})
		for _, r := range c.replicas {
			if r.ID == id {
				return r
			}
		}
		t.Fatalf("shard %d's leader %q is none of ours", shard, id)
		return nil
	}
	lead := leaderOf("")
	var other *replica
	for _, r := range c.replicas {
		if r != lead {
			other = r
		}
	}
	// An hour of minutes, ending a minute ago: 60 slots.
	to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	from := to.Add(-59 * time.Minute)
	want := map[string]bool{}
	for s := from; !s.After(to); s = s.Add(time.Minute) {
		id := celery.SlotIDOf(keys.Cluster(c.prefix), "bf", s)
		want[string(id[:])] = true
	}
	code, out, errs := c.apiCLI(other, "admin", "backfill", "bf", "--rate", "15", "--json",
		"--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339))
	if code != 0 {
		t.Fatalf("backfill on %s: exit %d: %s", other.ID, code, errs)
	}
	var ans api.BackfillAnswer
	if err := json.Unmarshal([]byte(out), &ans); err != nil || ans.Job == nil {
		t.Fatalf("backfill answer %v: %s", err, out)
	}
	job := func() store.Backfill {
		t.Helper()
		_, out, _ := c.apiCLI(other, "admin", "backfill", "--list", "bf", "--json")
		var l struct{ Backfills []store.Backfill }
		_ = json.Unmarshal([]byte(out), &l)
		for _, j := range l.Backfills {
			if j.ID == ans.Job.ID {
				return j
			}
		}
		return store.Backfill{}
	}
	// inRange is the task ids in the queue of slots in the range (the
	// entry's own fires are of later slots), with each one's replica:
	// every publish carries its term's token.
	inRange := func() (ids []string, tokens map[int64]bool) {
		tokens = map[int64]bool{}
		for _, m := range c.audit("bf") {
			if !m.Slot.After(to) {
				ids, tokens[m.Token] = append(ids, m.TaskID), true
			}
		}
		return ids, tokens
	}
	waitFor(t, 20*time.Second, "the backfill under way", func() bool {
		j := job()
		return j.State == store.BackfillRunning && j.Published >= 10
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	st, err := status.Shards(ctx, c.observer, c.prefix)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	firstToken := st[shard].FencingToken
	if _, tokens := inRange(); len(tokens) != 1 || !tokens[firstToken] {
		t.Fatalf("backfill published under tokens %v, want only shard %d's leader's %d", tokens, shard, firstToken)
	}
	// The shard's leader is killed: the other replica takes the shard once
	// its lease expires, and finishes the backfill.
	lead.Signal(syscall.SIGKILL)
	<-lead.Done()
	if next := leaderOf(lead.ID); next != other {
		t.Fatalf("shard %d led by %s, want %s", shard, next.ID, other.ID)
	}
	waitFor(t, 30*time.Second, "the shard's next leader to finish the backfill", func() bool { return job().State == store.BackfillDone })
	ids, tokens := inRange()
	seen := map[string]int{}
	for _, id := range ids {
		seen[id]++
	}
	for w := range want {
		if seen[w] != 1 {
			t.Errorf("task %s published %d times", w, seen[w])
		}
	}
	j := job()
	if len(ids) != 60 || j.Published != 60 || j.Total != 60 {
		t.Errorf("%d messages; job %+v", len(ids), j)
	}
	if len(tokens) != 2 {
		t.Errorf("published under tokens %v: want the first shard leader's and the next's", tokens)
	}
	byFirst := 0
	for _, m := range c.audit("bf") {
		if !m.Slot.After(to) && m.Token == firstToken {
			byFirst++
		}
	}
	t.Logf("60 slots of bf (shard %d) published once each: %d by %s before its kill -9, %d by %s", shard, byFirst, lead.ID, 60-byFirst, other.ID)
}
