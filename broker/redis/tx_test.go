package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
	goredis "github.com/redis/go-redis/v9"
)

// beforeExec runs fn (if set) once, just before the first MULTI/EXEC a
// client sends: after the transaction's reads, before its writes. It
// counts the transactions sent.
type beforeExec struct {
	once  sync.Once
	fn    func()
	execs int
}

func (h *beforeExec) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *beforeExec) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *beforeExec) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" {
			h.execs++
			if h.fn != nil {
				h.once.Do(h.fn)
			}
		}
		return next(ctx, cmds)
	}
}

// TestFenceRaisedBeforeExec: a new leader raises the fence after a
// deposed leader's transaction read it and before its EXEC. The EXEC
// is refused, the read again finds the fence above the token, and
// nothing of the deposed leader's reaches Redis.
func TestFenceRaisedBeforeExec(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	admin := rs.Client()
	ctx := context.Background()
	opts := Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"}
	old := New(admin, opts)
	if err := old.RaiseFence(ctx, 5); err != nil {
		t.Fatal(err)
	}
	task := namedTask(t, "e", "{task: tasks.add, every: 1s}")
	publishAll(t, old, 5, slotFires(task, 1))

	deposed := rs.Client()
	raised := false
	deposed.AddHook(&beforeExec{fn: func() {
		if err := New(admin, opts).RaiseFence(ctx, 6); err != nil {
			t.Error(err)
		}
		raised = true
	}})
	p := New(deposed, opts)
	res := make([]broker.Result, 2)
	err := p.Publish(ctx, 5, slotFires(task, 2, 3), res)
	if !raised {
		t.Fatal("the hook never ran: the publish sent no MULTI")
	}
	if !errors.Is(err, broker.ErrStale) || res[0] != broker.ResultStale || res[1] != broker.ResultStale {
		t.Fatalf("publish raced by a fence raise: %v %v, want stale", res, err)
	}
	if n := admin.LLen(ctx, "celery").Val(); n != 1 {
		t.Fatalf("queue holds %d messages, want only slot 1's", n)
	}
	h, err := old.Histories(ctx, []string{"e"})
	if err != nil || h["e"].Count != 1 {
		t.Fatalf("history %+v %v: the deposed leader's records got in", h["e"], err)
	}
}

// TestConcurrentPublishesOfOneEntry: manual triggers from several
// goroutines and the scheduled slots of the same entry, all at once, in
// tight loops. The publishes take turns (Publisher.pub): every fire is
// pushed exactly once, the run count counts each, and the mark ends at
// the last slot. A fire left pending with an error is retried, as the
// scheduler retries it.
func TestConcurrentPublishesOfOneEntry(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	ctx := context.Background()
	p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", History: 5})
	task := namedTask(t, "e", "{task: tasks.add, every: 1s}")
	const triggerers, triggers, slots = 4, 10, 30
	// publish retries a fire until Redis took it or called it a
	// duplicate, as the scheduler does with a pending fire.
	publish := func(f []celery.Fire) (broker.Result, error) {
		res := make([]broker.Result, 1)
		for range 20 {
			err := p.Publish(ctx, 1, f, res)
			if err == nil && res[0] != broker.ResultError {
				return res[0], nil
			}
			if err != nil && res[0] != broker.ResultError {
				return res[0], err
			}
		}
		return res[0], errors.New("still pending after 20 publishes")
	}
	var wg sync.WaitGroup
	errs := make(chan error, triggerers+1)
	for g := range triggerers {
		wg.Go(func() {
			for k := range triggers {
				f := []celery.Fire{{Task: task, Slot: markSlot, Manual: true, Request: "r" + strconv.Itoa(g) + "-" + strconv.Itoa(k)}}
				if r, err := publish(f); err != nil || r != broker.ResultOK {
					errs <- errors.Join(err, errors.New("trigger: "+r.String()))
					return
				}
			}
		})
	}
	wg.Go(func() {
		for s := 1; s <= slots; s++ {
			if r, err := publish(slotFires(task, s)); err != nil || r != broker.ResultOK {
				errs <- errors.Join(err, errors.New("slot "+strconv.Itoa(s)+": "+r.String()))
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	const total = triggerers*triggers + slots
	if n := client.LLen(ctx, "celery").Val(); n != total {
		t.Fatalf("queue holds %d messages, want %d", n, total)
	}
	h, err := p.Histories(ctx, []string{"e"})
	if err != nil || h["e"].Count != total {
		t.Fatalf("run count %d (%v), want %d: a concurrent record was lost", h["e"].Count, err, total)
	}
	// The newest record carries the last slot as the mark: slot 30 again
	// is a duplicate, 31 is not.
	res := publishAll(t, p, 1, slotFires(task, slots, slots+1))
	if !equalResults(res, broker.ResultDuplicate, broker.ResultOK) {
		t.Fatalf("after the race: %v", res)
	}
	// Trimmed every History runs, the list never holds twice that.
	if n := client.LLen(ctx, p.historyKey("e")).Val(); n < 5 || n >= 10 {
		t.Fatalf("history list holds %d records, want 5 to 9 (history 5)", n)
	}
}

// TestParseHead reads the mark and count that lead a run record.
func TestParseHead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		head  string
		want  mark
		known bool
	}{
		{"1764496800000000 7 1764496800000000000 1764496800000123 3 0", mark{slot: 1764496800000000, has: true, runs: 7}, true},
		{" 2 1764496800000000000 1764496800000123 3 1 id", mark{runs: 2}, true}, // manual runs only: no mark yet
		{"99999999999999999999 4 x", mark{runs: 4}, true},                       // past int64: below every slot
		{"", mark{}, false}, // no record
		{"1764496800000000000,1764496800000123,3,id,0", mark{}, false}, // the previous release's format
		{"12 x 3", mark{}, false},
		{"12 3", mark{}, false},
	} {
		m, known := parseHead(tc.head)
		if m != tc.want || known != tc.known {
			t.Errorf("parseHead(%q) = %+v, %v; want %+v, %v", tc.head, m, known, tc.want, tc.known)
		}
	}
}

// TestMarkCache: the marks a term remembers never make a fresh slot a
// duplicate. An attempt whose EXEC is refused starts again from the
// remembered mark, not from what the refused attempt advanced it to; an
// entry forgotten starts afresh; another leader's term in between is
// read from Redis, not from what this publisher remembers of its own.
func TestMarkCache(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	admin := rs.Client()
	ctx := context.Background()
	opts := Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"}
	task := namedTask(t, "e", "{task: tasks.add, every: 1s}")

	t.Run("refused attempt", func(t *testing.T) {
		admin.FlushAll(ctx)
		c := rs.Client()
		p := New(c, opts)
		if err := p.RaiseFence(ctx, 1); err != nil {
			t.Fatal(err)
		}
		publishAll(t, p, 1, slotFires(task, 1)) // the mark, now remembered
		touched := false
		// Rewriting the fence with its own value changes no token but
		// refuses the EXEC of whoever watched it.
		c.AddHook(&beforeExec{fn: func() { touched = admin.Set(ctx, p.fenceKey, "1", 0).Err() == nil }})
		res := publishAll(t, p, 1, slotFires(task, 2, 3))
		if !touched || !equalResults(res, broker.ResultOK, broker.ResultOK) {
			t.Fatalf("after a refused EXEC: %v (hook ran: %v), want both pushed", res, touched)
		}
		if n := admin.LLen(ctx, "celery").Val(); n != 3 {
			t.Fatalf("queue holds %d messages, want 3", n)
		}
	})
	t.Run("forgotten entry", func(t *testing.T) {
		admin.FlushAll(ctx)
		p := New(rs.Client(), opts)
		publishAll(t, p, 1, slotFires(task, 5))
		if err := p.Forget(ctx, 1, []string{"e"}); err != nil {
			t.Fatal(err)
		}
		if res := publishAll(t, p, 1, slotFires(task, 3)); !equalResults(res, broker.ResultOK) {
			t.Fatalf("an entry back after Forget: %v, want its slot pushed", res)
		}
	})
	t.Run("another term between", func(t *testing.T) {
		admin.FlushAll(ctx)
		p, other := New(rs.Client(), opts), New(rs.Client(), opts)
		if err := p.RaiseFence(ctx, 1); err != nil {
			t.Fatal(err)
		}
		publishAll(t, p, 1, slotFires(task, 5))
		if err := other.RaiseFence(ctx, 2); err != nil {
			t.Fatal(err)
		}
		publishAll(t, other, 2, slotFires(task, 6, 7, 8))
		if err := p.RaiseFence(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if res := publishAll(t, p, 3, slotFires(task, 6, 9)); !equalResults(res, broker.ResultDuplicate, broker.ResultOK) {
			t.Fatalf("after another leader's term: %v, want 6 a duplicate and 9 pushed", res)
		}
	})
}

// TestFailedReadLeavesNoWatch: a flight's WATCH goes out with its reads,
// so a read that fails leaves no EXEC to end it. The connection goes
// back to the pool unwatched: after a fence raise, the next publish on
// it (a pool of one) commits on its first EXEC instead of having it
// refused by the old WATCH.
func TestFailedReadLeavesNoWatch(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	admin := rs.Client()
	ctx := context.Background()
	opts := Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"}
	one := goredis.NewClient(&goredis.Options{Addr: admin.Options().Addr, PoolSize: 1})
	defer one.Close()
	p := New(one, opts)
	if err := p.RaiseFence(ctx, 5); err != nil {
		t.Fatal(err)
	}
	task := namedTask(t, "e", "{task: tasks.add, every: 1s}")
	// The entry's history key of the wrong type fails its LINDEX.
	if err := admin.HSet(ctx, p.historyKey("e"), "x", "1").Err(); err != nil {
		t.Fatal(err)
	}
	res := make([]broker.Result, 1)
	if err := p.Publish(ctx, 5, slotFires(task, 1), res); err == nil {
		t.Fatalf("publish over a history of the wrong type: %v, want an error", res)
	}
	admin.Del(ctx, p.historyKey("e"))
	if err := New(admin, opts).RaiseFence(ctx, 6); err != nil {
		t.Fatal(err)
	}
	var count beforeExec
	one.AddHook(&count)
	p = New(one, opts)
	if got := publishAll(t, p, 6, slotFires(task, 1)); !equalResults(got, broker.ResultOK) {
		t.Fatalf("publish after the fence raise: %v", got)
	}
	if count.execs != 1 {
		t.Fatalf("%d transactions sent, want 1: a WATCH from the failed publish refused an EXEC", count.execs)
	}
}
