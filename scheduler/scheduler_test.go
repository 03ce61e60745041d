package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/publisher"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeDispatcher records what was published and can be told to fail.
type fakeDispatcher struct {
	mu        sync.Mutex
	published []string // "entry slot" or "entry manual"
	seen      map[string]bool
	fence     int64
	Err       error // returned by Publish while set
	notify    chan struct{}
}

func newFakeDispatcher() *fakeDispatcher {
	return &fakeDispatcher{seen: map[string]bool{}, notify: make(chan struct{}, 1000)}
}

func (d *fakeDispatcher) RaiseFence(_ context.Context, token int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if token < d.fence {
		return publisher.ErrStale
	}
	d.fence = token
	return nil
}

func (d *fakeDispatcher) Publish(_ context.Context, token int64, fires []publisher.Fire, results []publisher.Result) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.Err != nil {
		return d.Err
	}
	for i := range fires {
		f := &fires[i]
		f.ID = f.Task.SlotID(f.Slot)
		if token < d.fence {
			results[i] = publisher.ResultStale
			continue
		}
		key := f.Task.Name + " " + f.Slot.UTC().Format(time.RFC3339)
		if f.Manual {
			key = f.Task.Name + " manual"
		}
		if d.seen[key] && !f.Manual {
			results[i] = publisher.ResultDuplicate
			continue
		}
		d.seen[key] = true
		d.published = append(d.published, key)
		results[i] = publisher.ResultOK
		d.notify <- struct{}{}
	}
	for _, r := range results {
		if r == publisher.ResultStale {
			return publisher.ErrStale
		}
	}
	return nil
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
}

func newMemStore(token int64) *memStore {
	return &memStore{states: map[string]*store.EntryState{}, token: token, watch: make(chan struct{}, 10)}
}

func (s *memStore) Load(context.Context) (map[string]*store.EntryState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]*store.EntryState{}
	for k, v := range s.states {
		out[k] = snapshot(v)
	}
	return out, nil
}

func (s *memStore) Save(_ context.Context, g store.Guard, states []*store.EntryState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.Token != s.token {
		return store.ErrNotLeader
	}
	s.saves++
	for _, st := range states {
		s.states[st.Name] = snapshot(st)
	}
	return nil
}

func (s *memStore) Prune(context.Context, store.Guard, map[string]*store.EntryState, map[string]bool, time.Time, time.Duration) error {
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

func (s *memStore) CompleteRequest(_ context.Context, g store.Guard, r store.Request, st *store.EntryState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.Token != s.token {
		return store.ErrNotLeader
	}
	for i, q := range s.requests {
		if q.ID == r.ID {
			s.requests = append(s.requests[:i], s.requests[i+1:]...)
			break
		}
	}
	if st != nil {
		s.states[st.Name] = snapshot(st)
	}
	return nil
}

func (s *memStore) request(op store.Op, entry string) {
	s.mu.Lock()
	s.nextID++
	s.requests = append(s.requests, store.Request{ID: fmt.Sprintf("r%d", s.nextID), Op: op, Entry: entry})
	s.mu.Unlock()
	s.watch <- struct{}{}
}

func (s *memStore) get(name string) *store.EntryState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.states[name]; st != nil {
		return snapshot(st)
	}
	return nil
}

type harness struct {
	t      *testing.T
	clock  *FakeClock
	disp   *fakeDispatcher
	store  *memStore
	sched  *Scheduler
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func mustConfig(t testing.TB, yaml string) *schedule.Config {
	t.Helper()
	cfg, err := schedule.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newHarness(t *testing.T, yaml string, now time.Time) *harness {
	t.Helper()
	h := &harness{t: t, clock: NewFakeClock(now), disp: newFakeDispatcher(), store: newMemStore(7), reg: prometheus.NewRegistry()}
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
	go func() { h.done <- h.sched.Run(ctx, Term{Token: token, Key: "/leader"}) }()
	h.t.Cleanup(func() { cancel(); <-h.done })
}

// waitPublished waits until n fires were published in total.
func (h *harness) waitPublished(n int) []string {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got := h.disp.list(); len(got) >= n {
			return got
		}
		time.Sleep(time.Millisecond)
	}
	h.t.Fatalf("published %v, want %d fires", h.disp.list(), n)
	return nil
}

// settle waits until the loop is blocked on its timer (a timer is armed at
// a deadline after the fake now) and nothing more is published.
func (h *harness) settle() {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if at, ok := h.clock.NextDeadline(); ok && at.After(h.clock.Now()) {
			before := len(h.disp.list())
			time.Sleep(5 * time.Millisecond)
			if len(h.disp.list()) == before {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	h.t.Fatal("loop did not settle")
}

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
	if st == nil || !st.LastSlot.Equal(t0.Add(time.Minute)) || st.TotalRunCount != 6 || len(st.Recent) != 6 || st.Recent[0].Token != 7 {
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
				if got := testutil.ToFloat64(h.sched.cfg.Metrics.Missed.WithLabelValues("e", reason)); got != want {
					t.Errorf("missed{%s} = %v, want %v", reason, got, want)
				}
			}
			// The regular schedule resumes at the next slot.
			h.clock.Set(t0.Add(time.Hour))
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
	deadline := time.Now().Add(5 * time.Second)
	for h.sched.PublishError() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if h.sched.PublishError() == nil {
		t.Fatal("publish error not reported")
	}
	for i := 0; i < 3; i++ { // outage spans two more slots; backoff timers fire
		h.clock.Advance(10 * time.Second)
		time.Sleep(10 * time.Millisecond)
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
	if h.sched.PublishError() != nil {
		t.Error("publish error not cleared")
	}
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

func TestRefusedWriteEndsTerm(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0)
	h.start(7)
	h.settle()
	h.store.mu.Lock()
	h.store.token = 8 // a new term began in etcd
	h.store.mu.Unlock()
	h.clock.Advance(10 * time.Second)
	select {
	case err := <-h.done:
		if !errors.Is(err, ErrTermEnded) {
			t.Fatalf("Run = %v", err)
		}
		h.done <- err
	case <-time.After(5 * time.Second):
		t.Fatal("loop ignored a refused write")
	}
}

func TestReload(t *testing.T) {
	h := newHarness(t, "entries:\n  same: {task: t, every: 10s, relative: true}\n  changed: {task: t, every: 10s, relative: true}\n  gone: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	h.start(7)
	h.settle()
	// At 10:00:09 the config changes: "changed" becomes hourly. It must not
	// fire now (django-celery-beat fires on every edit), "same" keeps its
	// 10:00:10 slot, "gone" stops, "new" starts at its next slot.
	h.clock.Set(t0.Add(9 * time.Second))
	if err := h.sched.Reload(mustConfig(t, "entries:\n  same: {task: t, every: 10s, relative: true}\n  changed: {task: t, every: 1h, relative: true}\n  new: {task: t, every: 10s, relative: true}\n")); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if got := h.disp.list(); len(got) != 0 {
		t.Fatalf("reload fired %v", got)
	}
	h.clock.Set(t0.Add(10 * time.Second))
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

func TestJitterDeterministic(t *testing.T) {
	t.Parallel()
	e := &entry{Entry: &schedule.Entry{Name: "e", Jitter: 30 * time.Second}}
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
	deadline := time.Now().Add(5 * time.Second)
	for (h.store.get("e") == nil || !h.store.get("e").Paused) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := h.store.get("e"); !st.Paused || st.TotalRunCount != 1 || !st.Recent[0].Manual {
		t.Fatalf("after trigger and pause: %+v", st)
	}
	h.settle()
	h.clock.Set(t0.Add(20 * time.Second)) // two slots while paused
	h.settle()
	if got := h.disp.list(); len(got) != 1 {
		t.Fatalf("paused entry fired: %v", got)
	}
	if got := testutil.ToFloat64(h.sched.cfg.Metrics.Missed.WithLabelValues("e", ReasonPaused)); got != 2 {
		t.Errorf("missed{paused} = %v, want 2", got)
	}
	h.store.request(store.OpResume, "e")
	for h.store.get("e").Paused && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	h.settle()
	h.clock.Set(t0.Add(30 * time.Second))
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
	h.clock.Set(t0.Add(time.Hour))
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
	a.clock.Set(t0.Add(55 * time.Second))
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
		h.done <- h.sched.Run(ctx, Term{Token: 7, Key: "/leader", Elected: t0.Add(-10 * time.Millisecond)})
	}()
	t.Cleanup(func() { cancel(); <-h.done })
	got := h.waitPublished(1)
	if got[0] != "s 2026-11-30T10:00:00Z" {
		t.Fatalf("fired %v, want the 10:00:00 slot due after the election", got)
	}
	// 09:59:59, due before the election, was an outage slot: skipped.
	if n := testutil.ToFloat64(h.sched.cfg.Metrics.Missed.WithLabelValues("s", ReasonSkip)); n != 1 {
		t.Errorf("missed{skip} = %v, want 1", n)
	}
}
