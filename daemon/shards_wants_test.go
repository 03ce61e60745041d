package daemon

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// testShardSet is a shardSet of n shards as replica id, past its cold
// start, counting live replicas, with view as its last read.
func testShardSet(id string, n, live int, v *shardView) *shardSet {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 5, 18, 0, 0, 0, time.UTC))
	s := &shardSet{id: id, n: n, clock: clock, loading: make(chan struct{}, 1)}
	for i := range n {
		s.shards = append(s.shards, &shard{i: i})
	}
	s.live.Store(int64(live))
	if v != nil {
		v.held = map[string]int{}
		for _, l := range v.leaders {
			if l != "" {
				v.held[l]++
			}
		}
		s.view.Store(v)
	}
	return s
}

// leaders is a view of 16 shards: a leads 0–5, b 6–10, c 11–15, but
// those given as free.
func leaders(free ...int) *shardView {
	v := &shardView{leaders: make([]string, 16), waiters: make([][]string, 16)}
	for i := range 16 {
		switch {
		case i <= 5:
			v.leaders[i] = "a"
		case i <= 10:
			v.leaders[i] = "b"
		default:
			v.leaders[i] = "c"
		}
	}
	for _, i := range free {
		v.leaders[i] = ""
	}
	return v
}

// TestShardWants pins which shards a replica campaigns (and so loads its
// entries) for: only those it is owed, and of each other replica no more
// than that replica will hand over.
func TestShardWants(t *testing.T) {
	for _, tc := range []struct {
		name     string
		live     int
		view     *shardView
		held     []int // shards d leads
		prepared []int // shards d has loaded for a campaign
		quiet    []int // shards d handed over a moment ago
		// ids are the live replicas; the free shards have been free
		// for freeFor.
		ids     []string
		freeFor time.Duration
		// lastLeader led the free shards before.
		lastLeader string
		// unread: no live replicas read yet (else ids, or the view's
		// leaders and d).
		unread bool
		// loads are the other replicas' registrations' Loading, by
		// shard; loading are the shards d reads the entries of now.
		loads   map[int][]string
		loading []int
		shard   int
		want    bool
	}{
		{name: "a joiner, the shard of a replica 2 above its share", live: 4, view: leaders(), shard: 0, want: true},
		{name: "a joiner, the shard of a replica 1 above", live: 4, view: leaders(), shard: 6, want: true},
		{name: "a's surplus of 2 claimed by lower shards", live: 4, view: leaders(), prepared: []int{0, 1}, shard: 2},
		{name: "a's surplus: this one is among the 2 lowest", live: 4, view: leaders(), prepared: []int{0, 1}, shard: 1, want: true},
		{name: "a replica at its least share hands nothing over", live: 4, view: leaders(0, 1), shard: 2},
		{name: "a free shard", live: 4, view: leaders(3), prepared: []int{0, 1}, shard: 3, want: true},
		{name: "at its most share", live: 4, view: leaders(), held: []int{12, 13, 14, 15}, shard: 0},
		{name: "between shares: a leader at the most keeps it", live: 3, view: leaders(0, 1, 2, 3, 4, 5), held: []int{0, 1, 2, 3, 4}, shard: 6},
		{name: "between shares: a free shard", live: 3, view: leaders(0, 1, 2, 3, 4, 5), held: []int{0, 1, 2, 3, 4}, shard: 5, want: true},
		{name: "between shares: one just handed over", live: 3, view: leaders(0, 1, 2, 3, 4, 5), held: []int{0, 1, 2, 3, 4}, quiet: []int{5}, shard: 5},
		{name: "below its least share: one just handed over is owed back", live: 3, view: leaders(5), ids: []string{"a", "b", "d"}, quiet: []int{5}, shard: 5, want: true},
		{name: "its share unknown: the live replicas not read yet", live: 4, view: leaders(), unread: true, shard: 0},
		{name: "a dead replica's shard, falling to this one (3 mod 2 = rank of d)", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, shard: 3, want: true},
		{name: "a dead replica's shard, falling to the other", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, shard: 2},
		{name: "a dead replica's shard when no registration is read (its own lapsed too)", live: 2, view: leaders(2, 3), ids: []string{}, shard: 2, want: true},
		{name: "a shard a live replica let go", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, lastLeader: "a", shard: 2, want: true},
		{name: "a shard handed to it, unled until it wins", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, prepared: []int{2}, shard: 2, want: true},
		{name: "a dead replica's shard the other has not taken", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, freeFor: shardFreeWait, shard: 2, want: true},
		{name: "a free shard the other loads", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, freeFor: shardFreeWait, loads: map[int][]string{2: {"a"}}, shard: 2},
		{name: "a free shard both load, the other first for it", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, freeFor: shardFreeWait, loads: map[int][]string{2: {"a"}}, loading: []int{2}, shard: 2},
		{name: "a free shard both load, this one first for it", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, freeFor: shardFreeWait, loads: map[int][]string{3: {"a"}}, loading: []int{3}, shard: 3, want: true},
		{name: "a free shard the other loads, which this one has loaded", live: 2, view: leaders(2, 3), ids: []string{"a", "d"}, freeFor: shardFreeWait, loads: map[int][]string{2: {"a"}}, prepared: []int{2}, shard: 2, want: true},
		{name: "a shard of a dead leader", live: 3, view: leaders(), ids: []string{"a", "b", "d"}, shard: 12, want: true},
		{name: "a shard of a dead leader another survivor loads", live: 3, view: leaders(), ids: []string{"a", "b", "d"}, loads: map[int][]string{12: {"b"}}, shard: 12},
		{name: "a shard of a dead leader another survivor loads, not this one", live: 3, view: leaders(), ids: []string{"a", "b", "d"}, loads: map[int][]string{12: {"b"}}, shard: 13, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testShardSet("d", 16, tc.live, tc.view)
			for _, i := range tc.held {
				s.shards[i].handover = func() {}
			}
			for _, i := range tc.prepared {
				s.shards[i].prepared = func() {}
			}
			ids := tc.ids
			if ids == nil && tc.view != nil {
				ids = []string{"d"}
				for _, l := range tc.view.leaders {
					if l != "" && !slices.Contains(ids, l) {
						ids = append(ids, l)
					}
				}
				slices.Sort(ids)
			}
			if !tc.unread {
				s.ids.Store(&ids)
			}
			if v := s.view.Load(); v != nil {
				v.freeSince, v.lastLeader = make([]time.Time, 16), make([]string, 16)
				for i, l := range v.leaders {
					if l == "" {
						v.freeSince[i], v.lastLeader[i] = s.clock.Now().Add(-tc.freeFor), tc.lastLeader
					}
				}
			}
			for _, i := range tc.quiet {
				s.shards[i].handedAt = s.clock.Now()
			}
			for _, i := range tc.loading {
				s.shards[i].loadingNow = true
			}
			if tc.loads != nil {
				loads := make([][]string, 16)
				for i, ids := range tc.loads {
					loads[i] = ids
				}
				s.loads.Store(&loads)
			}
			if got := s.wants(s.shards[tc.shard]); got != tc.want {
				t.Errorf("wants(shard %d) = %v, want %v", tc.shard, got, tc.want)
			}
		})
	}
}

// TestShardPrepare: a shard's entries are loaded before its campaign
// only while the shards led and loaded stay within the most share, and
// a failed load leaves nothing held.
func TestShardPrepare(t *testing.T) {
	var loads []int
	fail := false
	s := testShardSet("d", 4, 2, nil) // share 2
	s.defs = func(_ context.Context, i int) (func(), error) {
		if fail {
			return nil, errors.New("etcd: no answer")
		}
		loads = append(loads, i)
		return func() { loads = append(loads, -i-1) }, nil
	}
	ctx := context.Background()
	s.shards[0].handover = func() {} // leads one
	if ok, err := s.prepare(ctx, s.shards[1]); !ok || err != nil {
		t.Fatalf("prepare(1) = %v, %v; want loaded", ok, err)
	}
	if ok, err := s.prepare(ctx, s.shards[1]); !ok || err != nil || len(loads) != 1 {
		t.Fatalf("prepare(1) again = %v, %v, loads %v; want loaded once", ok, err, loads)
	}
	if ok, _ := s.prepare(ctx, s.shards[2]); ok || len(loads) != 1 {
		t.Fatalf("prepare(2) past the share = %v, loads %v; want nothing loaded", ok, loads)
	}
	s.unprepare(s.shards[1])
	if len(loads) != 2 || loads[1] != -2 || s.pending() != 0 {
		t.Fatalf("unprepare(1): loads %v, pending %d; want shard 1 dropped", loads, s.pending())
	}
	fail = true
	if ok, err := s.prepare(ctx, s.shards[2]); ok || err == nil || s.pending() != 0 {
		t.Fatalf("a failed load: %v, %v, pending %d; want an error and nothing held", ok, err, s.pending())
	}
	fail = false
	if ok, _ := s.prepare(ctx, s.shards[2]); !ok {
		t.Fatal("prepare(2) after the failure: want loaded")
	}
	if stop, _ := s.shards[2].takePrepared(); stop == nil || s.pending() != 0 {
		t.Fatal("a term takes the loaded entries: want its stop, and nothing pending")
	}
}

// TestShardPrepareAbandoned: a load the replica stops wanting (here it
// drains) is abandoned, not waited for, and leaves nothing held.
func TestShardPrepareAbandoned(t *testing.T) {
	s := testShardSet("d", 4, 2, leaders())
	ids := []string{"a", "d"}
	s.ids.Store(&ids)
	started := make(chan struct{})
	s.defs = func(ctx context.Context, i int) (func(), error) {
		close(started)
		<-ctx.Done() // a load that takes long
		return nil, ctx.Err()
	}
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := s.prepare(context.Background(), s.shards[3])
		done <- result{ok, err}
	}()
	<-started
	s.draining.Store(true)
	fc := s.clock.(*clockwork.FakeClock)
	for {
		select {
		case r := <-done:
			if r.ok || r.err != nil || s.pending() != 0 {
				t.Fatalf("an abandoned load: %v, %v, pending %d; want not loaded, no error, nothing held", r.ok, r.err, s.pending())
			}
			return
		case <-time.After(10 * time.Millisecond):
			fc.Advance(shardBalanceEvery)
		}
	}
}

// TestShardLoadWaitsForAStart: a shard's load does not begin while a
// term of this replica is starting, nor while a shard it loaded waits for
// its term, and begins once that term schedules; a term that starts
// lifts the GC until then, but not while a shard loads.
func TestShardLoadWaitsForAStart(t *testing.T) {
	s := testShardSet("d", 4, 2, nil) // share 2
	loaded := make(chan int, 4)
	s.defs = func(_ context.Context, i int) (func(), error) { loaded <- i; return func() {}, nil }
	lifts := 0
	s.lift = func() func() { lifts++; return func() { lifts-- } }

	done := make(chan error, 1)
	prepare := func(i int) {
		go func() { _, err := s.prepare(context.Background(), s.shards[i]); done <- err }()
	}
	notYet := func(while string) {
		t.Helper()
		select {
		case i := <-loaded:
			t.Fatalf("shard %d loaded while %s", i, while)
		case <-time.After(200 * time.Millisecond):
		}
	}
	loads := func(i int, once string) {
		t.Helper()
		select {
		case <-loaded:
		case <-time.After(10 * time.Second):
			t.Fatalf("shard %d's load did not begin once %s", i, once)
		}
		if err := <-done; err != nil {
			t.Fatalf("prepare(%d): %v", i, err)
		}
	}

	scheduling := s.termStarting()
	if lifts != 1 {
		t.Fatalf("a term starting with no load under way: %d lifts, want 1", lifts)
	}
	prepare(1)
	notYet("a term was starting")
	scheduling()
	scheduling() // Run's return after the scheduling: nothing more
	if lifts != 0 {
		t.Fatalf("the term scheduling: %d lifts left, want 0", lifts)
	}
	loads(1, "the term was scheduling")

	// Shard 1 is loaded and waits for its term: shard 2's load waits
	// too, while that term starts, and begins once it schedules.
	prepare(2)
	notYet("shard 1 waited for its term")
	stop, waited := s.shards[1].takePrepared() // its term begins
	scheduling = s.termStarting()
	waited()
	notYet("shard 1's term was starting")
	scheduling()
	loads(2, "shard 1's term was scheduling")
	stop()
	s.unprepare(s.shards[2]) // its campaign ends: nothing waits

	s.loading <- struct{}{} // a load under way
	scheduling = s.termStarting()
	if lifts != 0 {
		t.Fatalf("a term starting while a shard loads: %d lifts, want 0", lifts)
	}
	scheduling()
	<-s.loading
}

// TestStartGate: idle returns at once when no start is counted, when
// the last start ends, after startGateWait however long a start takes,
// and with ctx's error when ctx ends first.
func TestStartGate(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var g startGate
	ctx := context.Background()
	if err := g.idle(ctx, clock); err != nil {
		t.Fatalf("no start: %v", err)
	}
	end1, end2 := g.begin(), g.begin()
	idle := make(chan error, 1)
	go func() { idle <- g.idle(ctx, clock) }()
	end1()
	select {
	case err := <-idle:
		t.Fatalf("one of two starts ended: idle returned %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	end2()
	if err := <-idle; err != nil {
		t.Fatalf("both ended: %v", err)
	}

	end := g.begin() // a start that does not end
	defer end()
	go func() { idle <- g.idle(ctx, clock) }()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(startGateWait)
	if err := <-idle; err != nil {
		t.Fatalf("after startGateWait: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.idle(cctx, clock); !errors.Is(err, context.Canceled) {
		t.Fatalf("ctx ended: %v, want context.Canceled", err)
	}
}
