package leader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	beatdtest "github.com/beatd/beatd/testkit/testutil"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/scheduler"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeElector hands out whatever the test sends on results, one per
// campaign; a campaign with nothing to hand out blocks until its ctx ends.
type fakeElector struct {
	results   chan any // *fakeLease or error
	campaigns atomic.Int64
}

func newFakeElector() *fakeElector { return &fakeElector{results: make(chan any)} }

func (e *fakeElector) Campaign(ctx context.Context) (Lease, error) {
	e.campaigns.Add(1)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case r := <-e.results:
		if err, ok := r.(error); ok {
			return nil, err
		}
		return r.(*fakeLease), nil
	}
}

type fakeLease struct {
	token    int64
	ctx      context.Context
	lose     context.CancelCauseFunc
	resigned chan struct{}
	once     sync.Once
}

var errLost = errors.New("lease lost")

func newFakeLease(token int64) *fakeLease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &fakeLease{token: token, ctx: ctx, lose: cancel, resigned: make(chan struct{})}
}

func (l *fakeLease) Fence() election.Fence    { return election.Fence{Key: "leader/key", Token: l.token} }
func (l *fakeLease) Context() context.Context { return l.ctx }
func (l *fakeLease) Resign(context.Context) error {
	l.once.Do(func() { l.lose(errors.New("resigned")); close(l.resigned) })
	return nil
}

// harness runs a Loop whose Lead reports each term on terms and holds it
// until its ctx ends.
type harness struct {
	t        *testing.T
	clock    *clockwork.FakeClock
	elector  *fakeElector
	loop     *Loop
	reg      *prometheus.Registry
	errs     prometheus.Counter
	terms    chan termCall
	cancel   context.CancelFunc
	done     chan struct{}
	leadHook func(ctx context.Context, t Term) // runs after Lead's ctx ends, before Lead returns
}

type termCall struct {
	ctx  context.Context
	term Term
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, clock: clockwork.NewFakeClockAt(t0), elector: newFakeElector(), reg: prometheus.NewRegistry(),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "errs"}), terms: make(chan termCall, 1), done: make(chan struct{})}
	loop, err := New(Config{Elector: h.elector, Clock: h.clock, Registerer: h.reg, CampaignErrors: h.errs,
		Lead: func(ctx context.Context, term Term) error {
			h.terms <- termCall{ctx, term}
			<-ctx.Done()
			if h.leadHook != nil {
				h.leadHook(ctx, term)
			}
			return ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	h.loop = loop
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { defer close(h.done); h.loop.Run(ctx) }()
	h.t.Cleanup(func() { cancel(); <-h.done })
}

func (h *harness) stop() {
	h.t.Helper()
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		h.t.Fatal("Run did not return after its ctx ended")
	}
}

func (h *harness) send(r any) {
	h.t.Helper()
	select {
	case h.elector.results <- r:
	case <-time.After(5 * time.Second):
		h.t.Fatal("the loop did not campaign")
	}
}

func (h *harness) term() termCall {
	h.t.Helper()
	select {
	case c := <-h.terms:
		return c
	case <-time.After(5 * time.Second):
		h.t.Fatal("Lead was not called")
		return termCall{}
	}
}

// expectBackoff waits for the loop to arm its backoff timer, checks that
// it fires at the retry policy's n-th interval from 100 ms (doubling,
// ±20% jitter), and lets it fire.
func (h *harness) expectBackoff(n int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
		h.t.Fatal(err)
	}
	base := campaignBackoffMin << n
	h.clock.Advance(base*8/10 - time.Nanosecond)
	if !h.waiting() {
		h.t.Fatalf("backoff %d ended before %v", n, base*8/10)
	}
	h.clock.Advance(base*4/10 + time.Nanosecond)
	if h.waiting() {
		h.t.Fatalf("backoff %d still waiting after %v", n, base*12/10)
	}
}

// waiting reports whether a timer is armed now: the loop's only timer is
// its backoff, and the fake clock fires timers within Advance.
func (h *harness) waiting() bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return h.clock.BlockUntilContext(ctx, 1) == nil
}

func (h *harness) metric(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// TestFailedCampaignsBackOff: each failed campaign counts as an etcd error
// and waits the retry policy's next interval on the injected clock; a
// won term resets the backoff.
func TestFailedCampaignsBackOff(t *testing.T) {
	h := newHarness(t)
	h.start()
	for n := range 3 {
		h.send(errors.New("etcd down"))
		if got := h.elector.campaigns.Load(); got != int64(n+1) {
			t.Fatalf("%d campaigns before the backoff, want %d", got, n+1)
		}
		h.expectBackoff(n)
	}
	if v := h.metric(h.errs); v != 3 {
		t.Errorf("campaign errors = %v, want 3", v)
	}
	lease := newFakeLease(7)
	h.send(lease)
	h.term()
	lease.lose(errLost)
	h.send(errors.New("etcd down again"))
	h.expectBackoff(0) // reset by the term
}

// TestTerm: a won term runs Lead with its fence and start; while it runs
// the loop reports it; when the lease is lost, Lead's ctx ends, the term
// is resigned, and the loop campaigns again.
func TestTerm(t *testing.T) {
	h := newHarness(t)
	h.start()
	if tok, _ := h.loop.Term(); tok != 0 || h.metric(h.loop.isLeader) != 0 {
		t.Fatalf("leading before a term: token %d", tok)
	}
	lease := newFakeLease(42)
	h.send(lease)
	c := h.term()
	want := scheduler.Term{Fence: election.Fence{Token: 42, Key: "leader/key"}, Elected: t0}
	if got := c.term.Term; got.Fence != want.Fence || !got.Elected.Equal(want.Elected) || got.Scheduling != nil {
		t.Errorf("Lead got %+v, want %+v", got, want)
	}
	if tok, elected := h.loop.Term(); tok != 42 || !elected.Equal(t0) || h.loop.Token() != 42 {
		t.Errorf("Term() = %d, %v during the term", tok, elected)
	}
	if h.metric(h.loop.isLeader) != 1 || h.metric(h.loop.fencingToken) != 42 || h.metric(h.loop.leaderChanges) != 1 {
		t.Errorf("metrics during the term: is_leader %v, token %v, changes %v",
			h.metric(h.loop.isLeader), h.metric(h.loop.fencingToken), h.metric(h.loop.leaderChanges))
	}

	lease.lose(errLost)
	select {
	case <-c.ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Lead's ctx did not end with the lease")
	}
	select {
	case <-lease.resigned:
	case <-time.After(5 * time.Second):
		t.Fatal("a lost term was not resigned")
	}
	next := newFakeLease(43)
	h.send(next) // it campaigns again, at once
	h.term()
	if v := h.metric(h.loop.leaderChanges); v != 3 {
		t.Errorf("leader changes = %v after one term and the start of another, want 3", v)
	}
	if h.metric(h.errs) != 0 {
		t.Error("a lost term counted as a campaign error")
	}
	if h.loop.Stopped() {
		t.Error("Stopped while running")
	}
}

// TestShutdownWhileLeading: Lead's ctx ends at shutdown while the lease
// still holds (so it can persist as leader); only then is the term
// resigned, and Run returns with the replica no longer leading.
func TestShutdownWhileLeading(t *testing.T) {
	h := newHarness(t)
	var leaseAtEnd atomic.Bool
	h.leadHook = func(_ context.Context, term Term) { leaseAtEnd.Store(term.Lease.Err() == nil) }
	h.start()
	lease := newFakeLease(5)
	h.send(lease)
	h.term()
	h.stop()
	if !leaseAtEnd.Load() {
		t.Error("the lease had ended before Lead returned on shutdown")
	}
	select {
	case <-lease.resigned:
	default:
		t.Error("Run returned without resigning its term")
	}
	if h.loop.Token() != 0 || h.metric(h.loop.isLeader) != 0 || h.metric(h.loop.leaderChanges) != 2 {
		t.Errorf("after shutdown: token %d, is_leader %v, changes %v", h.loop.Token(), h.metric(h.loop.isLeader), h.metric(h.loop.leaderChanges))
	}
	if h.metric(h.loop.fencingToken) != 5 {
		t.Errorf("beatd_fencing_token = %v after the term, want the last term's 5", h.metric(h.loop.fencingToken))
	}
	if !h.loop.Stopped() {
		t.Error("not Stopped after Run returned")
	}
}

// TestShutdownWhileCampaigning: a shutdown during a campaign or its
// backoff is not an error.
func TestShutdownWhileCampaigning(t *testing.T) {
	t.Run("campaign", func(t *testing.T) {
		h := newHarness(t)
		h.start()
		beatdtest.Eventually(t, 5*time.Second, "a campaign", func() bool { return h.elector.campaigns.Load() > 0 })
		h.stop()
		if h.metric(h.errs) != 0 {
			t.Error("a cancelled campaign counted as an etcd error")
		}
	})
	t.Run("backoff", func(t *testing.T) {
		h := newHarness(t)
		h.start()
		h.send(errors.New("etcd down"))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := h.clock.BlockUntilContext(ctx, 1); err != nil { // in the backoff
			t.Fatal(err)
		}
		h.stop()
		if got := h.elector.campaigns.Load(); got != 1 {
			t.Errorf("%d campaigns, want 1: a shutdown during the backoff campaigns no more", got)
		}
	})
}

func TestMetricsRegistered(t *testing.T) {
	h := newHarness(t)
	for name, want := range map[string]int{"beatd_is_leader": 1, "beatd_fencing_token": 1, "beatd_leader_changes_total": 1} {
		if n, err := testutil.GatherAndCount(h.reg, name); err != nil || n != want {
			t.Errorf("%s: %d series, %v", name, n, err)
		}
	}
	if _, err := New(Config{Elector: h.elector, Lead: func(context.Context, Term) error { return nil }, Registerer: h.reg}); err == nil {
		t.Error("registering the leadership metrics twice succeeded")
	}
}

// TestStaleTermsBackOff: a term the broker refuses as stale ends at once;
// the loop pauses before the next campaign (1 s, then 2 s) instead of
// campaigning again at once, and a term that ends otherwise resets that.
func TestStaleTermsBackOff(t *testing.T) {
	h := newHarness(t)
	stale := true
	loop, err := New(Config{Elector: h.elector, Clock: h.clock, Registerer: prometheus.NewRegistry(), CampaignErrors: h.errs,
		Lead: func(ctx context.Context, term Term) error {
			h.terms <- termCall{ctx, term}
			if stale {
				return fmt.Errorf("scheduler: term ended: raise fence: %w", broker.ErrStale)
			}
			<-ctx.Done()
			return ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	h.loop = loop
	h.start()
	for n, base := range []time.Duration{time.Second, 2 * time.Second} {
		h.send(newFakeLease(int64(10 + n)))
		h.term()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		cancel()
		campaigns := h.elector.campaigns.Load()
		h.clock.Advance(base*8/10 - time.Nanosecond)
		if !h.waiting() || h.elector.campaigns.Load() != campaigns {
			t.Fatalf("stale term %d: campaigned again before %v", n, base*8/10)
		}
		h.clock.Advance(base*4/10 + time.Nanosecond)
		if h.waiting() {
			t.Fatalf("stale term %d: still paused after %v", n, base*12/10)
		}
	}
}
