package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestShardQuietMoves pins when a replica hands a shard over: not within
// handoverSpacing of its last handover, not while it or another replica
// is busy, unless its handover has waited handoverQuietWait for that.
func TestShardQuietMoves(t *testing.T) {
	for _, tc := range []struct {
		name       string
		selfBusy   bool
		otherBusy  bool
		otherWaits bool // another replica waits for its move: not busy
		since      time.Duration
		lastMove   time.Duration // ago; 0: none
		want       bool
	}{
		{name: "quiet", want: true},
		{name: "another waits for its move", otherWaits: true, want: true},
		{name: "another busy", otherBusy: true, want: false},
		{name: "itself busy", selfBusy: true, want: false},
		{name: "busy, held a while", otherBusy: true, since: handoverQuietWait - time.Second, want: false},
		{name: "busy, held the longest", otherBusy: true, since: handoverQuietWait, want: true},
		{name: "just moved", lastMove: handoverSpacing / 2, want: false},
		{name: "moved a spacing ago", lastMove: handoverSpacing, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testShardSet("a", 16, 3, leaders())
			clock := s.clock.(*clockwork.FakeClock)
			if tc.lastMove > 0 {
				s.moved()
				clock.Advance(tc.lastMove)
			}
			s.others.Store(&otherReplicas{busy: tc.otherBusy, waiting: tc.otherWaits})
			if tc.selfBusy {
				defer s.work()()
			}
			first := s.quiet(handoverQuietWait)
			clock.Advance(tc.since)
			if got := s.quiet(handoverQuietWait); got != tc.want {
				t.Fatalf("quiet() = %v, want %v (first call %v)", got, tc.want, first)
			}
		})
	}

	// A wait starts afresh once no handover waits.
	s := testShardSet("a", 16, 3, leaders())
	clock := s.clock.(*clockwork.FakeClock)
	s.others.Store(&otherReplicas{busy: true})
	s.quiet(handoverQuietWait)
	clock.Advance(handoverQuietWait - time.Second)
	s.noMove()
	clock.Advance(time.Second)
	if s.quiet(handoverQuietWait) {
		t.Fatal("a handover held 1 s since noMove went ahead: its wait did not start afresh")
	}
}

// TestShardActivity: the registration says busy while the replica loads
// a shard, starts a term or drops a shard's entries, and waiting while it
// holds a shard loaded for its move.
func TestShardActivity(t *testing.T) {
	s := testShardSet("d", 4, 2, nil)
	check := func(when string, busy, waiting bool) {
		t.Helper()
		if b, w := s.activity(); b != busy || w != waiting {
			t.Fatalf("%s: activity() = busy %v, waiting %v; want %v, %v", when, b, w, busy, waiting)
		}
	}
	check("idle", false, false)
	inLoad := make(chan struct{})
	release := make(chan struct{})
	dropped := make(chan struct{})
	s.defs = func(context.Context, int) (func(), error) {
		close(inLoad)
		<-release
		return func() { check("dropping", true, false); close(dropped) }, nil
	}
	done := make(chan error, 1)
	go func() { _, err := s.prepare(context.Background(), s.shards[1]); done <- err }()
	<-inLoad
	check("loading", true, false)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	check("loaded", false, true)
	s.unprepare(s.shards[1])
	<-dropped
	check("dropped", false, false)
	scheduling := s.termStarting()
	check("a term starting", true, false)
	scheduling()
	check("the term scheduling", false, false)
}

// TestShardLoadAheadWaits: a load ahead of a move (its shard led by
// another registered replica) waits while another replica is busy or
// waits for its move, handoverQuietWait at most; a load of a shard nobody
// leads, or whose leader is gone (kill -9), does not.
func TestShardLoadAheadWaits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		shard    int
		leader   bool // shard's leader registered
		others   otherReplicas
		waitsFor time.Duration // 0: none
	}{
		{name: "ahead, others quiet", shard: 6, leader: true},
		{name: "ahead, another busy", shard: 6, leader: true, others: otherReplicas{busy: true}, waitsFor: handoverQuietWait},
		{name: "ahead, another waits", shard: 6, leader: true, others: otherReplicas{waiting: true}, waitsFor: handoverQuietWait},
		{name: "leader gone", shard: 6, others: otherReplicas{busy: true}},
		{name: "free shard", shard: 2, leader: true, others: otherReplicas{busy: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testShardSet("d", 16, 4, leaders(2))
			clock := s.clock.(*clockwork.FakeClock)
			o := tc.others
			o.registered = map[string]bool{"d": true, "a": true, "c": true}
			if tc.leader {
				o.registered["b"] = true
			}
			s.others.Store(&o)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.waitTurn(ctx, s.shards[tc.shard]) }()
			if tc.waitsFor == 0 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				return
			}
			if err := clock.BlockUntilContext(ctx, 1); err != nil {
				t.Fatal(err)
			}
			clock.Advance(tc.waitsFor - shardBalanceEvery)
			select {
			case err := <-done:
				t.Fatalf("returned %v before handoverQuietWait", err)
			case <-time.After(100 * time.Millisecond):
			}
			// The other replicas quiet down: it goes at its next look.
			s.others.Store(&otherReplicas{registered: o.registered})
			clock.Advance(shardBalanceEvery)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}

	// However long the others stay busy, it waits handoverQuietWait at most.
	s := testShardSet("d", 16, 4, leaders())
	clock := s.clock.(*clockwork.FakeClock)
	s.others.Store(&otherReplicas{busy: true, registered: map[string]bool{"b": true}})
	done := make(chan error, 1)
	go func() { done <- s.waitTurn(context.Background(), s.shards[6]) }()
	for range int(handoverQuietWait / shardBalanceEvery) {
		if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(shardBalanceEvery)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitTurn still waited after handoverQuietWait")
	}
}

// TestShardQueuedLoadWaits: a load queued behind another (two campaigns
// preparing at once) waits for the first one's term as well: the gate is
// checked once its turn comes, not before it queued.
func TestShardQueuedLoadWaits(t *testing.T) {
	s := testShardSet("d", 4, 1, nil)
	release := make(chan struct{})
	loaded := make(chan int, 4)
	s.defs = func(_ context.Context, i int) (func(), error) {
		if i == 1 {
			<-release
		}
		loaded <- i
		return func() {}, nil
	}
	done := make(chan error, 2)
	prepare := func(i int) {
		go func() { _, err := s.prepare(context.Background(), s.shards[i]); done <- err }()
	}
	state := func(i int) (preparing, loading bool) {
		sh := s.shards[i]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.preparing, sh.loadingNow
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	prepare(1)
	until("shard 1 loading", func() bool { _, l := state(1); return l })
	prepare(2)
	until("shard 2 queued", func() bool { p, _ := state(2); return p })
	close(release)
	if i := <-loaded; i != 1 {
		t.Fatalf("loaded shard %d first, want 1", i)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case i := <-loaded:
		t.Fatalf("shard %d loaded while shard 1 waited for its term", i)
	case <-time.After(300 * time.Millisecond):
	}
	stop, waited := s.shards[1].takePrepared()
	defer stop()
	scheduling := s.termStarting()
	waited()
	scheduling()
	select {
	case i := <-loaded:
		if i != 2 {
			t.Fatalf("loaded shard %d, want 2", i)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shard 2 did not load once shard 1's term scheduled")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
