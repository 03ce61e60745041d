package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/jonboulle/clockwork"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/store"
	beatdtest "github.com/beatd/beatd/testkit/testutil"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeDispatcher records what was published and can be told to fail.
type fakeDispatcher struct {
	mu        sync.Mutex
	published []string // "entry slot" or "entry manual"
	seen      map[string]bool
	fence     int64
	Err       error  // returned by Publish while set
	failEntry string // its fires fail (ResultError) while set
	forgotten []string
	// manualSlots is each manual fire's slot, in publish order.
	manualSlots []time.Time
	// closed is each term CloseTerm recorded as ended cleanly.
	closed []int64
}

func (d *fakeDispatcher) CloseTerm(_ context.Context, token int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = append(d.closed, token)
	return nil
}

func newFakeDispatcher() *fakeDispatcher {
	return &fakeDispatcher{seen: map[string]bool{}}
}

func (d *fakeDispatcher) RaiseFence(_ context.Context, token int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if token < d.fence {
		return broker.ErrStale
	}
	d.fence = token
	return nil
}

func (d *fakeDispatcher) Publish(_ context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.Err != nil {
		return d.Err
	}
	var failed error
	for i := range fires {
		f := &fires[i]
		f.ID = f.Task.SlotID(f.Slot)
		if f.Task.Name == d.failEntry {
			results[i], failed = broker.ResultError, fmt.Errorf("entry %q: WRONGTYPE", f.Task.Name)
			continue
		}
		if token < d.fence {
			results[i] = broker.ResultStale
			continue
		}
		key := f.Task.Name + " " + f.Slot.UTC().Format(time.RFC3339)
		if f.Manual {
			key = f.Task.Name + " manual"
			d.manualSlots = append(d.manualSlots, f.Slot)
		}
		if d.seen[key] && !f.Manual {
			results[i] = broker.ResultDuplicate
			continue
		}
		d.seen[key] = true
		d.published = append(d.published, key)
		results[i] = broker.ResultOK
	}
	for _, r := range results {
		if r == broker.ResultStale {
			return broker.ErrStale
		}
	}
	return failed
}

func (d *fakeDispatcher) Forget(_ context.Context, token int64, entries []string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if token < d.fence {
		return broker.ErrStale
	}
	d.forgotten = append(d.forgotten, entries...)
	return nil
}

func (d *fakeDispatcher) forgottenList() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.forgotten...)
}

func (d *fakeDispatcher) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.published...)
}

func (d *fakeDispatcher) setErr(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Err = err
}

// memStore is an in-memory StateStore with a settable leader token.
type memStore struct {
	mu       sync.Mutex
	states   map[string]*store.EntryState
	token    int64
	requests []store.Request
	nextID   int
	watch    chan struct{}
	saves    int
	failWith error // Save fails with it while set
	hang     bool  // Save blocks until its context ends while set
}

// setFailing makes Save fail with err (nil: succeed), or hang.
func (s *memStore) setFailing(err error, hang bool) {
	s.mu.Lock()
	s.failWith, s.hang = err, hang
	s.mu.Unlock()
}

func newMemStore(token int64) *memStore {
	return &memStore{states: map[string]*store.EntryState{}, token: token, watch: make(chan struct{}, 10)}
}

func (s *memStore) Load(context.Context) (*store.Table, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := store.NewTable()
	for _, v := range s.states {
		t.Set(*v)
	}
	t.MarkClean()
	return t, nil
}

func (s *memStore) Save(ctx context.Context, g election.Fence, t *store.Table, also []string) error {
	s.mu.Lock()
	if s.hang {
		s.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	defer s.mu.Unlock()
	if s.failWith != nil {
		return s.failWith
	}
	if g.Token != s.token {
		return store.ErrNotLeader
	}
	s.saves++
	s.states = t.States()
	t.MarkClean()
	for _, key := range also {
		for i, q := range s.requests {
			if q.Key == key {
				s.requests = append(s.requests[:i], s.requests[i+1:]...)
				break
			}
		}
	}
	return nil
}

func (s *memStore) PendingRequests(context.Context) ([]store.Request, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]store.Request(nil), s.requests...), 0, nil
}

func (s *memStore) WatchRequests(ctx context.Context, _ int64) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.watch:
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

func (s *memStore) request(op store.Op, entry string) {
	s.requestAt(op, entry, time.Time{})
}

// requestAt queues a request as a replica whose clock read at queued it.
func (s *memStore) requestAt(op store.Op, entry string, at time.Time) {
	s.mu.Lock()
	s.nextID++
	id := fmt.Sprintf("r%d", s.nextID)
	s.requests = append(s.requests, store.Request{ID: id, Key: id, Op: op, Entry: entry, RequestedAt: at})
	s.mu.Unlock()
	s.watch <- struct{}{}
}

func (s *memStore) pending() []store.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]store.Request(nil), s.requests...)
}

func (s *memStore) get(name string) *store.EntryState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.states[name]; st != nil {
		c := *st
		return &c
	}
	return nil
}

type harness struct {
	t      *testing.T
	clock  *clockwork.FakeClock
	disp   *fakeDispatcher
	store  *memStore
	sched  *Scheduler
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func mustConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newHarness(t *testing.T, yaml string, now time.Time) *harness {
	t.Helper()
	h := &harness{t: t, clock: clockwork.NewFakeClockAt(now), disp: newFakeDispatcher(), store: newMemStore(7), reg: prometheus.NewRegistry()}
	s, err := New(Config{Dispatcher: h.disp, Store: h.store, Clock: h.clock, Metrics: NewMetrics(h.reg), Cluster: "beatd/test", Origin: "beatd@test"}, mustConfig(t, yaml))
	if err != nil {
		t.Fatal(err)
	}
	h.sched = s
	return h
}

func (h *harness) start(token int64) {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.sched.Run(ctx, Term{Fence: election.Fence{Token: token, Key: "/leader"}}) }()
	h.t.Cleanup(func() { cancel(); <-h.done })
}

// waitPublished waits until n fires were published in total.
func (h *harness) waitPublished(n int) []string {
	h.t.Helper()
	eventually(h.t, 5*time.Second, fmt.Sprintf("%d fires", n), func() bool { return len(h.disp.list()) >= n })
	return h.disp.list()
}

// eventually is testkit/testutil's Eventually (testutil is prometheus's
// package in this file).
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	beatdtest.Eventually(t, timeout, what, cond)
}

// settle waits until the loop and the persister are idle: the loop has
// applied the latest config, and each has armed its timer, which the loop
// does only once nothing is due or pending.
func (h *harness) settle() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A reload not yet applied: the loop re-arms its timer once it is.
	beatdtest.Eventually(h.t, 5*time.Second, "the loop to apply the reload", func() bool {
		return h.sched.applied.Load() == h.sched.entries.Load()
	})
	if err := h.clock.BlockUntilContext(ctx, 2); err != nil {
		h.t.Fatalf("loop did not settle: %v", err)
	}
}

// setClock moves the fake clock to t, firing the timers due by then.
func setClock(c *clockwork.FakeClock, t time.Time) { c.Advance(t.Sub(c.Now())) }

func slots(name string, times ...string) []string {
	out := make([]string, len(times))
	for i, s := range times {
		out[i] = name + " " + s
	}
	return out
}

func TestFiresOnSlots(t *testing.T) {
	h := newHarness(t, "entries:\n  tick: {task: t, every: 10s, relative: true}\n  cron: {task: t, cron: '*/30 * * * * *'}\n", t0.Add(3*time.Second))
	h.start(7)
	h.settle()
	if got := h.disp.list(); len(got) != 0 {
		t.Fatalf("fired at start: %v (a new entry must wait for its next slot)", got)
	}
	for i := 0; i < 6; i++ {
		h.clock.Advance(10 * time.Second)
		h.settle()
	}
	got := h.waitPublished(8)
	want := append(slots("tick", "2026-11-30T10:00:10Z", "2026-11-30T10:00:20Z", "2026-11-30T10:00:30Z"), "cron 2026-11-30T10:00:30Z")
	want = append(want, slots("tick", "2026-11-30T10:00:40Z", "2026-11-30T10:00:50Z", "2026-11-30T10:01:00Z")...)
	want = append(want, "cron 2026-11-30T10:01:00Z")
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("published\n%v\nwant\n%v", got, want)
	}
	h.cancel()
	if err := <-h.done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	h.done <- nil
	st := h.store.get("tick")
	if st == nil || !st.LastSlot.Equal(t0.Add(time.Minute)) {
		t.Fatalf("persisted state = %+v", st)
	}
}

func TestCatchupPolicies(t *testing.T) {
	tests := []struct {
		name       string
		policy     string
		wantFired  []string
		wantMissed map[string]float64
	}{
		{name: "once", policy: "catchup: once", wantFired: slots("e", "2026-11-30T10:59:00Z"),
			wantMissed: map[string]float64{ReasonOnce: 9, ReasonWindow: 49}},
		{name: "all capped", policy: "{catchup: all, max_catchup: 3}", wantFired: slots("e", "2026-11-30T10:57:00Z", "2026-11-30T10:58:00Z", "2026-11-30T10:59:00Z"),
			wantMissed: map[string]float64{ReasonMaxCatchup: 7, ReasonWindow: 49}},
		{name: "skip", policy: "catchup: skip", wantMissed: map[string]float64{ReasonSkip: 10, ReasonWindow: 49}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Last fired at 10:00; leadership starts at 10:59:30 with a
			// 10-minute window: 10:01-10:49 (49) are too old, 10:50-10:59
			// (10) are missed.
			policy := strings.TrimPrefix(strings.TrimSuffix(tt.policy, "}"), "{")
			h := newHarness(t, "entries:\n  e: {task: t, cron: '* * * * *', catchup_window: 10m, "+policy+"}\n", t0.Add(59*time.Minute+30*time.Second))
			h.store.states["e"] = &store.EntryState{Name: "e", LastSlot: t0}
			h.start(7)
			if len(tt.wantFired) > 0 {
				h.waitPublished(len(tt.wantFired))
			}
			h.settle()
			if got := h.disp.list(); strings.Join(got, ",") != strings.Join(tt.wantFired, ",") {
				t.Fatalf("fired %v, want %v", got, tt.wantFired)
			}
			for reason, want := range tt.wantMissed {
				if got := h.sched.cfg.Metrics.Missed.value("e", reason); got != want {
					t.Errorf("missed{%s} = %v, want %v", reason, got, want)
				}
			}
			// The regular schedule resumes at the next slot.
			setClock(h.clock, t0.Add(time.Hour))
			h.waitPublished(len(tt.wantFired) + 1)
		})
	}
}

func TestStartAtBackfill(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 1m, start_at: 2026-11-30T10:00:00Z, catchup: all}\n", t0.Add(150*time.Second))
	h.start(7)
	got := h.waitPublished(3)
	if want := slots("e", "2026-11-30T10:00:00Z", "2026-11-30T10:01:00Z", "2026-11-30T10:02:00Z"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("backfill %v, want %v", got, want)
	}
}

func TestBrokerDownKeepsSlotsPending(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0)
	h.disp.setErr(errors.New("connection refused"))
	h.start(7)
	h.settle()
	h.clock.Advance(10 * time.Second)
	eventually(t, 5*time.Second, "the publish error", func() bool { return h.sched.PublishError() != nil })
	for i := 0; i < 3; i++ { // outage spans two more slots; backoff timers fire
		h.clock.Advance(10 * time.Second)
		h.settle()
	}
	if st := h.store.get("e"); st != nil && !st.LastSlot.IsZero() {
		t.Fatalf("state advanced without a publish: %+v", st)
	}
	h.disp.setErr(nil)
	h.clock.Advance(5 * time.Second) // past any backoff
	got := h.waitPublished(4)
	want := slots("e", "2026-11-30T10:00:10Z", "2026-11-30T10:00:20Z", "2026-11-30T10:00:30Z", "2026-11-30T10:00:40Z")
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("after outage %v, want every slot in order %v", got, want)
	}
	// The dispatcher records a fire before the loop sees Publish return.
	eventually(t, 5*time.Second, "the publish error to clear", func() bool { return h.sched.PublishError() == nil })
}

func TestStaleEndsTerm(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0)
	h.disp.fence = 9 // a newer leader raised the fence
	h.start(7)
	select {
	case err := <-h.done:
		if !errors.Is(err, ErrTermEnded) {
			t.Fatalf("Run = %v, want ErrTermEnded", err)
		}
		h.done <- err
	case <-time.After(5 * time.Second):
		t.Fatal("stale leader kept running")
	}
	if got := h.disp.list(); len(got) != 0 {
		t.Fatalf("a stale leader published %v", got)
	}
}

// TestTermScheduling: a term's Scheduling is called once, once the term
// has started and before it publishes; a term that ends before it
// starts (a newer leader raised the fence) never calls it.
func TestTermScheduling(t *testing.T) {
	run := func(h *harness, token int64) (calls *atomic.Int32, published *atomic.Int32, done chan error) {
		calls, published, done = new(atomic.Int32), new(atomic.Int32), make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		term := Term{Fence: election.Fence{Token: token, Key: "/leader"}, Scheduling: func() {
			calls.Add(1)
			published.Store(int32(len(h.disp.list())))
		}}
		go func() { done <- h.sched.Run(ctx, term) }()
		t.Cleanup(func() { cancel(); <-done })
		return calls, published, done
	}
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0)
	calls, published, _ := run(h, 7)
	eventually(t, 5*time.Second, "the term scheduling", func() bool { return calls.Load() > 0 })
	h.settle()
	h.clock.Advance(10 * time.Second)
	h.waitPublished(1)
	if calls.Load() != 1 || published.Load() != 0 {
		t.Fatalf("Scheduling called %d times, with %d fires published; want once, before any", calls.Load(), published.Load())
	}

	h = newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0)
	h.disp.fence = 9
	calls, _, done := run(h, 7)
	select {
	case err := <-done:
		done <- err
		if !errors.Is(err, ErrTermEnded) || calls.Load() != 0 {
			t.Fatalf("a stale term: Run = %v, Scheduling called %d times; want ErrTermEnded, never", err, calls.Load())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a stale term kept running")
	}
}

func TestRefusedWriteEndsTerm(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0)
	h.start(7)
	h.settle()
	h.store.mu.Lock()
	h.store.token = 8 // a new term began in etcd
	h.store.mu.Unlock()
	// The baseline was written at the start; the slot's state is the next
	// write, refused at a state interval's tick after the fire. The clock
	// steps an interval at a time until it is, since the persister may
	// re-arm its timer after any one step.
	h.clock.Advance(10 * time.Second)
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-h.done:
			if !errors.Is(err, ErrTermEnded) {
				t.Fatalf("Run = %v", err)
			}
			h.done <- err
			return
		case <-deadline:
			t.Fatal("loop ignored a refused write")
		case <-time.After(20 * time.Millisecond):
			h.clock.Advance(time.Second)
		}
	}
}

func TestReload(t *testing.T) {
	for _, way := range reloadWays {
		t.Run(way.name, func(t *testing.T) { testReload(t, way.reload) })
	}
}

func testReload(t *testing.T, reload func(*Scheduler, *config.Config) error) {
	h := newHarness(t, "entries:\n  same: {task: t, every: 10s, relative: true}\n  changed: {task: t, every: 10s, relative: true}\n  gone: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	h.start(7)
	h.settle()
	// At 10:00:09 the config changes: "changed" becomes hourly. It must not
	// fire now (django-celery-beat fires on every edit), "same" keeps its
	// 10:00:10 slot, "gone" stops, "new" starts at its next slot.
	setClock(h.clock, t0.Add(9*time.Second))
	if err := reload(h.sched, mustConfig(t, "entries:\n  same: {task: t, every: 10s, relative: true}\n  changed: {task: t, every: 1h, relative: true}\n  new: {task: t, every: 10s, relative: true}\n")); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if got := h.disp.list(); len(got) != 0 {
		t.Fatalf("reload fired %v", got)
	}
	setClock(h.clock, t0.Add(10*time.Second))
	got := h.waitPublished(2)
	h.settle()
	got = h.disp.list()
	sort.Strings(got)
	want := []string{"new 2026-11-30T10:00:10Z", "same 2026-11-30T10:00:10Z"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("after reload %v, want %v", got, want)
	}
	if got := testutil.ToFloat64(h.sched.cfg.Metrics.Entries); got != 3 {
		t.Errorf("beatd_entries = %v", got)
	}
}

// reloadWays are the two ways a config change reaches the scheduler:
// whole (a schedules.yaml reload) and as the entries that changed (the
// entries API's). Each must give the same schedule.
var reloadWays = []struct {
	name   string
	reload func(*Scheduler, *config.Config) error
}{
	{"whole", (*Scheduler).Reload},
	{"delta", func(s *Scheduler, sc *config.Config) error {
		var changed []string
		cur := s.Config()
		for _, e := range cur.Entries {
			if n := sc.Entry(e.Name); n == nil || n.Fingerprint != e.Fingerprint {
				changed = append(changed, e.Name)
			}
		}
		for _, e := range sc.Entries {
			if cur.Entry(e.Name) == nil {
				changed = append(changed, e.Name)
			}
		}
		return s.ReloadDelta(sc, changed)
	}},
}

func TestJitterDeterministic(t *testing.T) {
	t.Parallel()
	e := &config.Entry{Name: "e", Jitter: 30 * time.Second}
	seen := map[time.Duration]bool{}
	for i := 0; i < 100; i++ {
		slot := t0.Add(time.Duration(i) * time.Minute)
		j := jitter(e, slot)
		if j < 0 || j >= 30*time.Second {
			t.Fatalf("jitter %v out of range", j)
		}
		if j != jitter(e, slot) {
			t.Fatal("jitter is not deterministic")
		}
		seen[j] = true
	}
	if len(seen) < 50 {
		t.Errorf("jitter barely varies: %d distinct values", len(seen))
	}
}

// TestTriggerSlotIsItsRequestTime: a manual fire's slot (what `{{ slot }}`
// renders) is when it was requested, not when a leader got to it, so a
// new leader that publishes an unfinished trigger again sends the same
// message.
func TestTriggerSlotIsItsRequestTime(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 1h}\n", t0.Add(time.Second))
	h.start(7)
	h.settle()
	asked := t0.Add(-30 * time.Second) // queued before this leader's term, on another replica's clock
	h.store.requestAt(store.OpTrigger, "e", asked)
	h.waitPublished(1)
	h.disp.mu.Lock()
	slots := append([]time.Time(nil), h.disp.manualSlots...)
	h.disp.mu.Unlock()
	if len(slots) != 1 || !slots[0].Equal(asked) {
		t.Fatalf("manual fire slots %v, want [%v]", slots, asked)
	}
}

// TestCleanEndIsRecorded: a term whose last state write succeeded tells
// the dispatcher so (RabbitMQ journals it, for a resize); one whose write
// failed does not, since its state may lack a batch it sent.
func TestCleanEndIsRecorded(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error
		want []int64
	}{
		{"state written", nil, []int64{7}},
		{"state write failed", errors.New("etcd: no leader"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "entries:\n  e: {task: t, every: 1s}\n", t0)
			h.start(7)
			h.settle()
			h.store.setFailing(tc.fail, false)
			setClock(h.clock, t0.Add(time.Second))
			h.waitPublished(1)
			h.cancel()
			err := <-h.done
			h.done <- err // for the harness's cleanup
			h.disp.mu.Lock()
			got := slices.Clone(h.disp.closed)
			h.disp.mu.Unlock()
			if !slices.Equal(got, tc.want) {
				t.Errorf("terms recorded as ended cleanly: %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAdminRequests(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	h.start(7)
	h.settle()
	h.store.request(store.OpTrigger, "e")
	got := h.waitPublished(1)
	if got[0] != "e manual" {
		t.Fatalf("trigger published %v", got)
	}
	h.store.request(store.OpPause, "e")
	eventually(t, 5*time.Second, "the pause", func() bool { st := h.store.get("e"); return st != nil && st.Paused })
	// A manual run does not move the entry's last slot, and both requests
	// are consumed once applied.
	if st := h.store.get("e"); !st.Paused || !st.LastSlot.IsZero() || len(h.store.pending()) != 0 {
		t.Fatalf("after trigger and pause: %+v, requests left %v", st, h.store.pending())
	}
	h.settle()
	setClock(h.clock, t0.Add(20*time.Second)) // two slots while paused
	h.settle()
	if got := h.disp.list(); len(got) != 1 {
		t.Fatalf("paused entry fired: %v", got)
	}
	if got := h.sched.cfg.Metrics.Missed.value("e", ReasonPaused); got != 2 {
		t.Errorf("missed{paused} = %v, want 2", got)
	}
	h.store.request(store.OpResume, "e")
	eventually(t, 5*time.Second, "the resume", func() bool { return !h.store.get("e").Paused })
	h.settle()
	setClock(h.clock, t0.Add(30*time.Second))
	got = h.waitPublished(2)
	if got[1] != "e 2026-11-30T10:00:30Z" {
		t.Fatalf("after resume %v", got)
	}
	h.store.mu.Lock()
	left := len(h.store.requests)
	h.store.mu.Unlock()
	if left != 0 {
		t.Errorf("%d requests left unconsumed", left)
	}
}

func TestManyDueAtOnceAreBatched(t *testing.T) {
	var b strings.Builder
	b.WriteString("entries:\n")
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&b, "  e%04d: {task: t, cron: '0 * * * *'}\n", i)
	}
	h := newHarness(t, b.String(), t0.Add(30*time.Minute))
	h.start(7)
	h.settle()
	setClock(h.clock, t0.Add(time.Hour))
	h.waitPublished(1000)
	h.settle()
	if got := len(h.disp.list()); got != 1000 {
		t.Fatalf("published %d", got)
	}
	h.cancel()
	<-h.done
	h.done <- nil
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	if len(h.store.states) != 1000 {
		t.Errorf("persisted %d states", len(h.store.states))
	}
	if h.store.saves > 100 {
		t.Errorf("%d Save calls for 1000 fires: state writes are not batched", h.store.saves)
	}
}

// TestTakeoverBeforeFirstFire: leader A schedules a new minute entry and
// dies before its first slot; leader B, taking over after that slot, still
// owes it (the drill found this). And after a config change, B owes
// nothing from before the change.
func TestTakeoverBeforeFirstFire(t *testing.T) {
	const before = "entries:\n  m: {task: t, cron: '* * * * *', catchup: once}\n  c: {task: t, every: 1h, catchup: all, relative: true}\n"
	const after = "entries:\n  m: {task: t, cron: '* * * * *', catchup: once}\n  c: {task: t, every: 10s, catchup: all, relative: true}\n"
	a := newHarness(t, before, t0.Add(30*time.Second))
	a.start(7)
	a.settle()
	// At 10:00:55, c becomes every 10s. A dies before 10:01:00.
	setClock(a.clock, t0.Add(55*time.Second))
	if err := a.sched.Reload(mustConfig(t, after)); err != nil {
		t.Fatal(err)
	}
	a.settle()
	a.cancel()
	<-a.done
	a.done <- nil
	if got := a.disp.list(); len(got) != 0 {
		t.Fatalf("A fired %v", got)
	}
	if st := a.store.get("m"); st == nil || !st.Since.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("no baseline persisted for m: %+v", st)
	}

	// B takes over at 10:01:30 with A's persisted state.
	b := newHarness(t, after, t0.Add(90*time.Second))
	b.store = a.store
	b.store.token = 8
	s, err := New(Config{Dispatcher: b.disp, Store: b.store, Clock: b.clock, Metrics: NewMetrics(prometheus.NewRegistry()), Cluster: "beatd/test"}, b.sched.Config())
	if err != nil {
		t.Fatal(err)
	}
	b.sched = s
	b.start(8)
	b.waitPublished(5)
	b.settle()
	got := b.disp.list()
	sort.Strings(got)
	// m owes its first slot; c owes its new schedule's slots since the
	// change at 10:00:55, not 10:00:40 or 10:00:50.
	want := []string{"c 2026-11-30T10:01:00Z", "c 2026-11-30T10:01:10Z", "c 2026-11-30T10:01:20Z", "c 2026-11-30T10:01:30Z", "m 2026-11-30T10:01:00Z"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("B fired %v, want %v", got, want)
	}
}

// TestSlotDuringStartupIsNotMissed: a slot due after the term was elected
// but before the loop finished starting is a regular slot, even under
// catchup: skip (the long drill found it dropped).
func TestSlotDuringStartupIsNotMissed(t *testing.T) {
	h := newHarness(t, "entries:\n  s: {task: t, every: 1s, catchup: skip, relative: true}\n", t0.Add(30*time.Millisecond))
	h.store.states["s"] = &store.EntryState{Name: "s", LastSlot: t0.Add(-2 * time.Second)}
	ctx, cancel := context.WithCancel(context.Background())
	h.done = make(chan error, 1)
	go func() {
		h.done <- h.sched.Run(ctx, Term{Fence: election.Fence{Token: 7, Key: "/leader"}, Elected: t0.Add(-10 * time.Millisecond)})
	}()
	t.Cleanup(func() { cancel(); <-h.done })
	got := h.waitPublished(1)
	if got[0] != "s 2026-11-30T10:00:00Z" {
		t.Fatalf("fired %v, want the 10:00:00 slot due after the election", got)
	}
	// 09:59:59, due before the election, was an outage slot: skipped.
	if n := h.sched.cfg.Metrics.Missed.value("s", ReasonSkip); n != 1 {
		t.Errorf("missed{skip} = %v, want 1", n)
	}
}

// TestEtcdRefusingWritesDoesNotStopFiring is the quota case: etcd refuses
// every write (NOSPACE) or hangs while the lease still holds. The leader
// must keep firing every slot on time, report the backlog, and catch the
// state up once etcd accepts writes again.
func TestEtcdRefusingWritesDoesNotStopFiring(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		hang bool
	}{
		{name: "nospace", err: errors.New("etcdserver: mvcc: database space exceeded")},
		{name: "hang", hang: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := "entries:\n"
			for i := range 50 {
				yaml += fmt.Sprintf("  e%02d: {task: t, every: 10s, relative: true}\n", i)
			}
			h := newHarness(t, yaml, t0.Add(time.Second))
			h.start(7)
			h.settle()
			h.store.setFailing(tc.err, tc.hang)
			for i := 1; i <= 5; i++ {
				setClock(h.clock, t0.Add(time.Duration(i)*10*time.Second))
				h.waitPublished(50 * i)
			}
			eventually(t, 5*time.Second, "failing state writes reported", func() bool {
				// The metrics are set just after the write that failed, and
				// the backlog's age at the first failure is 0 on a fake
				// clock if the slot's change came at the same instant: a
				// later tick reports it aged.
				m := h.sched.cfg.Metrics
				if h.sched.PersistError() != nil && testutil.ToFloat64(m.StatePersistFailing) == 1 && testutil.ToFloat64(m.StateUnpersistedAge) > 0 {
					return true
				}
				// Let the persister tick, without reaching the next slot.
				if h.clock.Now().Before(t0.Add(59 * time.Second)) {
					h.clock.Advance(100 * time.Millisecond)
				}
				return false
			})
			if v := testutil.ToFloat64(h.sched.cfg.Metrics.StatePersistFailing); v != 1 {
				t.Errorf("beatd_state_persist_failing = %v, want 1", v)
			}
			if v := testutil.ToFloat64(h.sched.cfg.Metrics.StateUnpersistedAge); v <= 0 {
				t.Errorf("beatd_state_unpersisted_age_seconds = %v, want > 0", v)
			}
			if st := h.store.get("e07"); st != nil && !st.LastSlot.IsZero() {
				t.Fatalf("state stored while etcd refused writes: %+v", st)
			}
			// Every slot fired exactly once, in order, on time.
			got := h.disp.list()
			seen := map[string]bool{}
			for _, f := range got {
				if seen[f] {
					t.Fatalf("fired twice: %s", f)
				}
				seen[f] = true
			}
			if len(got) != 250 {
				t.Fatalf("published %d fires, want 250", len(got))
			}

			h.store.setFailing(nil, false)
			want := t0.Add(50 * time.Second)
			beatdtest.EventuallyEvery(t, 10*time.Second, 5*time.Millisecond, "the state to catch up", func() bool {
				if st := h.store.get("e07"); st != nil && !st.LastSlot.Before(want) && h.sched.PersistError() == nil {
					return true
				}
				h.clock.Advance(time.Second)
				return false
			})
			if st := h.store.get("e07"); st == nil || st.LastSlot.Before(want) || !st.Since.Equal(t0.Add(time.Second)) {
				t.Fatalf("state did not catch up: %+v", st)
			}
			if h.sched.PersistError() != nil || testutil.ToFloat64(h.sched.cfg.Metrics.StatePersistFailing) != 0 {
				t.Error("failure still reported after state caught up")
			}
		})
	}
}

// TestShutdownWithRefusedWrites stops a leader whose etcd refuses writes:
// it must return within the shutdown budget, not wait for etcd.
func TestShutdownWithRefusedWrites(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	h.start(7)
	h.settle()
	h.store.setFailing(nil, true)
	setClock(h.clock, t0.Add(10*time.Second))
	h.waitPublished(1)
	start := time.Now()
	h.cancel()
	select {
	case <-h.done:
		h.done <- nil
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return with etcd hanging")
	}
	// finishBudget plus scheduling slack under -race on 2 cores.
	if took := time.Since(start); took > finishBudget+2*time.Second {
		t.Errorf("stopping took %v with etcd hanging", took)
	}
}

// TestOneFailingEntryDoesNotStopTheOthers: an entry whose publish keeps
// failing (its queue key holds another type) stays pending and retried,
// while every other entry keeps firing, late by at most the backoff.
func TestOneFailingEntryDoesNotStopTheOthers(t *testing.T) {
	h := newHarness(t, "entries:\n  bad: {task: t, every: 10s, relative: true}\n  good: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	h.disp.mu.Lock()
	h.disp.failEntry = "bad"
	h.disp.mu.Unlock()
	h.start(7)
	h.settle()
	for i := 1; i <= 4; i++ {
		setClock(h.clock, t0.Add(time.Duration(i)*10*time.Second))
		beatdtest.EventuallyEvery(t, 5*time.Second, 2*time.Millisecond, fmt.Sprintf("%d fires", i), func() bool {
			if len(h.disp.list()) >= i {
				return true
			}
			h.clock.Advance(time.Second) // past the retry backoff (at most 2.4s)
			return false
		})
	}
	want := slots("good", "2026-11-30T10:00:10Z", "2026-11-30T10:00:20Z", "2026-11-30T10:00:30Z", "2026-11-30T10:00:40Z")
	got := h.disp.list()
	if len(got) < 4 || strings.Join(got[:4], ",") != strings.Join(want, ",") {
		t.Fatalf("published %v, want the good entry's slots %v", got, want)
	}
	// The failing entry's first slot is still owed: fixed, it goes out.
	h.disp.mu.Lock()
	h.disp.failEntry = ""
	h.disp.mu.Unlock()
	beatdtest.EventuallyEvery(t, 5*time.Second, 2*time.Millisecond, "the failing entry's owed slot", func() bool {
		if slices.Contains(h.disp.list(), "bad 2026-11-30T10:00:10Z") {
			return true
		}
		h.clock.Advance(time.Second)
		return false
	})
}

// TestPersistEachBatchDoesNotWaitOnFailingEtcd: with per-batch state
// writes (RabbitMQ), a failing etcd must not make the next batch wait for
// the previous batch's write.
func TestPersistEachBatchDoesNotWaitOnFailingEtcd(t *testing.T) {
	h := newHarness(t, "entries:\n  a: {task: t, every: 10s, relative: true}\n  b: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	h.sched.cfg.PersistEachBatch = true
	h.sched.cfg.BatchSize = 1 // a and b go out in two batches
	h.start(7)
	h.settle()
	h.store.setFailing(nil, true) // every write hangs until its timeout
	setClock(h.clock, t0.Add(10*time.Second))
	h.waitPublished(2)
	// Let the persister notice the failing etcd (its write times out).
	eventually(t, 10*time.Second, "failing state writes reported", func() bool {
		if h.sched.PersistError() != nil {
			return true
		}
		h.clock.Advance(100 * time.Millisecond)
		return false
	})
	// The first batches may still wait on a write that began before the
	// error was seen (it started when the clock moved, before they were
	// due): the bound below is about the batches after it.
	h.settle()
	start := time.Now()
	setClock(h.clock, t0.Add(20*time.Second))
	h.waitPublished(4)
	// A batch that waited for the previous one's write would wait its
	// timeout (writeAttemptTimeout, 2 s): 1.5 s tells the two apart with
	// room for -race on 2 busy cores.
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("two batches took %v with etcd failing", took)
	}
}

// TestRemovedEntryForgottenAfterGrace: an entry a reload removes keeps
// its state, marked removed, for RemovedGrace; a long-lived term's sweep
// then drops its state and tells the broker to forget it. One that comes
// back within the grace is unmarked and keeps its place.
func TestRemovedEntryForgottenAfterGrace(t *testing.T) {
	for _, way := range reloadWays {
		t.Run(way.name, func(t *testing.T) { testRemovedEntryForgotten(t, way.reload) })
	}
}

func testRemovedEntryForgotten(t *testing.T, reload func(*Scheduler, *config.Config) error) {
	h := newHarness(t, "entries:\n  a: {task: t, every: 1h, relative: true}\n  b: {task: t, every: 10s, relative: true}\n  c: {task: t, every: 10s, relative: true}\n", t0)
	h.sched.cfg.RemovedGrace = 30 * time.Minute
	h.start(7)
	h.settle()
	setClock(h.clock, t0.Add(10*time.Second))
	h.waitPublished(2)
	h.settle()
	if err := reload(h.sched, mustConfig(t, "entries:\n  a: {task: t, every: 1h, relative: true}\n  c: {task: t, every: 10s, relative: true}\n")); err != nil {
		t.Fatal(err)
	}
	h.settle()
	setClock(h.clock, t0.Add(12*time.Second)) // the persister's next write
	eventually(t, 5*time.Second, "b marked removed in the store", func() bool {
		st := h.store.get("b")
		return st != nil && !st.RemovedAt.IsZero()
	})
	if got := h.disp.forgottenList(); len(got) != 0 {
		t.Fatalf("forgotten within the grace: %v", got)
	}
	setClock(h.clock, t0.Add(2*time.Hour))
	eventually(t, 5*time.Second, "b forgotten", func() bool { return slices.Equal(h.disp.forgottenList(), []string{"b"}) })
	h.settle()
	setClock(h.clock, t0.Add(2*time.Hour+2*time.Second)) // the persister's next write
	eventually(t, 5*time.Second, "b's state deleted", func() bool { return h.store.get("b") == nil })
	if h.store.get("c") == nil {
		t.Fatal("c's state was dropped")
	}
}

func TestNextSweepAt(t *testing.T) {
	day := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ now, want time.Time }{
		{day, day.Add(sweepEvery + 30*time.Second)},
		{day.Add(29 * time.Second), day.Add(sweepEvery + 30*time.Second)},
		{day.Add(30 * time.Second), day.Add(sweepEvery + 30*time.Second)},
		{day.Add(45*time.Second + time.Millisecond), day.Add(sweepEvery + 45*time.Second + time.Millisecond)},
	} {
		if got := nextSweepAt(tc.now); !got.Equal(tc.want) {
			t.Errorf("nextSweepAt(%s) = %s, want %s", tc.now.Format(time.TimeOnly), got.Format(time.TimeOnly), tc.want.Format(time.TimeOnly))
		}
	}
}
