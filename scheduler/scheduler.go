package scheduler

import (
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/jonboulle/clockwork"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/store"
	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// Dispatcher publishes fires, fenced by the leader's token.
type Dispatcher interface {
	RaiseFence(ctx context.Context, token int64) error
	Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error
}

// Forgetter is a Dispatcher that keeps something per entry in the broker
// (Redis: the mark, the run count and history) and can drop it once an
// entry is gone for good.
type Forgetter interface {
	Forget(ctx context.Context, token int64, entries []string) error
}

// LastPublisher is a Dispatcher that can say the last run it published
// of each entry (Redis: the entry's newest run record). A new leader
// reads it for the entries whose overlap policy must know a run in
// progress: its predecessor may have published one after its last state
// write.
type LastPublisher interface {
	LastPublished(ctx context.Context, entries []string) (map[string]broker.Run, error)
}

// StateStore persists entry state, every write guarded by leadership.
type StateStore interface {
	Load(ctx context.Context) (*store.Table, error)
	// Save writes the table's dirty buckets and deletes the keys in also
	// (completed admin requests) once the state is written.
	Save(ctx context.Context, g election.Fence, t *store.Table, also []string) error
	PendingRequests(ctx context.Context) ([]store.Request, int64, error)
	WatchRequests(ctx context.Context, rev int64) <-chan struct{}
}

var _ StateStore = (*store.Store)(nil)

// Term is the leadership the loop runs under.
type Term struct {
	election.Fence
	// Elected is when the term began. Slots due after it are regular slots
	// even if they pass while the loop starts up; only earlier ones are
	// missed and go through the catch-up policy. Zero means "now".
	Elected time.Time
}

// Config configures a Scheduler.
type Config struct {
	Dispatcher Dispatcher
	Store      StateStore
	Clock      clockwork.Clock
	Logger     *slog.Logger
	Metrics    *Metrics
	// Cluster, Origin and KombuPrefix are passed to celery.Compile.
	Cluster, Origin, KombuPrefix string
	// BatchSize is the most fires per pipelined publish (default 2048:
	// a publish's flights go out together, and 20,000 slots due at once
	// were out ~20% sooner than in batches of 512; BenchmarkBurst).
	BatchSize int
	// RemovedGrace keeps the state of removed entries this long.
	RemovedGrace time.Duration
	// StateInterval is the most often an entry's state is written to
	// etcd (default 1s). State may lag publishes by this much: a leader
	// that dies in between leaves slots that its successor re-publishes,
	// and the broker's dedup (Redis: each entry's high-water mark) makes
	// that a no-op.
	StateInterval time.Duration
	// DedupTTL is how long the broker remembers a published slot; a state
	// backlog older than that is reported as dangerous. Zero: for ever
	// (Redis's marks do not expire), so no backlog is.
	DedupTTL time.Duration
	// PersistEachBatch writes each published batch's state before the
	// next batch is published, for brokers whose dedup is weaker than
	// Redis's (one guarded etcd write per batch, not per fire).
	PersistEachBatch bool
	// FireLogLimit is how many per-fire INFO lines a second are logged;
	// past it, one summary line a second counts the rest. Negative: no
	// per-fire lines at all. Zero means DefaultFireLogLimit.
	FireLogLimit int
	// Outcomes, if set, is where the workers' reports about the runs
	// arrive: the loop records every run's outcome in its entry's state
	// and applies the entries' overlap and pause_after_failures. Nil:
	// outcomes are not tracked and overlap policies do not apply.
	Outcomes *outcome.Feed
	// OutcomeLive: an entry without overlap or pause_after_failures has
	// its runs recorded only while a source reported within this long
	// (default DefaultOutcomeLive).
	OutcomeLive time.Duration
	// Observer, if set, is called by the loop once per fire with its
	// outcome (the web console's fire timeline). It must not block.
	Observer func(entry string, slot time.Time, result broker.Result, lag time.Duration, manual bool)
}

// DefaultFireLogLimit is the per-fire log lines a second before they are
// summarised: readable at the few fires a second most clusters run,
// and cheap at 20k fires a second.
const DefaultFireLogLimit = 100

// Scheduler runs the leader's loop. Reload may be called at any time, from
// any goroutine; Run is called once per term.
type Scheduler struct {
	cfg     Config
	log     *slog.Logger
	entries atomic.Pointer[entrySet]
	reload  chan struct{}
	// mu orders a store to entries with the change it records in delta:
	// the names changed since the loop last applied the set, or full
	// when it must apply all of it (a Reload, or too many names).
	mu    sync.Mutex
	delta map[string]struct{}
	full  bool
	// publishErr is the last publish failure, nil once publishing works;
	// failingSince is when the failures in a row began (Unix ns, 0 when
	// publishing works).
	publishErr   atomic.Pointer[error]
	failingSince atomic.Int64
	// persist is the current term's persister, nil between terms.
	persist atomic.Pointer[persister]
	// applied is the config the running loop has applied; it trails
	// entries until the loop picks up a Reload.
	applied atomic.Pointer[entrySet]
}

// entry is a config entry compiled for publishing.
type entry struct {
	*config.Entry
	task *celery.Task // compiled on first fire, by the loop
	// fires holds the fire counters by broker.Result, then manual,
	// made at the first fire: an entry that never fired weighs 72 bytes
	// less, which counts at 100k entries.
	fires *[6]*Counter
	// runs holds its beatd_runs_total counters by outcome, made at the
	// first run that reaches each.
	runs *[outcome.NumKinds]*Counter
	// sched is the schedule the loop runs: the entry's, with an interval
	// anchored where it began (startEntry). Loop-owned; the definition
	// itself is never changed, so other goroutines read it freely.
	sched schedule.Schedule
	// it is the entry's next slot in the loop's heap, nil when it has
	// none. Loop-owned, and set anew by each term's start: it stands for
	// a map by name, which at a million entries weighs ~60 MB.
	it *item
	// pubSeq is the number of the last publication that held one of its
	// fires (publishPending). Loop-owned.
	pubSeq uint64
}

// entrySet is the running entries, in name order as config.Entries: a
// sorted slice, not a map, because a million entries make a map of
// ~50 MB and a change would copy it; a change copies the slice instead.
type entrySet struct {
	list   []*entry
	config *config.Config
}

// get returns the entry named name, or nil.
func (s *entrySet) get(name string) *entry {
	i, ok := slices.BinarySearchFunc(s.list, name, cmpName)
	if !ok {
		return nil
	}
	return s.list[i]
}

// New compiles cfg's entries. It fails if any entry cannot be compiled.
func New(c Config, sc *config.Config) (*Scheduler, error) {
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.RemovedGrace <= 0 {
		c.RemovedGrace = store.DefaultRemovedGrace
	}
	if c.StateInterval <= 0 {
		c.StateInterval = time.Second
	}
	if c.FireLogLimit == 0 {
		c.FireLogLimit = DefaultFireLogLimit
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	s := &Scheduler{cfg: c, log: c.Logger.With("component", "scheduler"), reload: make(chan struct{}, 1)}
	if err := s.Reload(sc); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload replaces the running config once every entry compiles. The loop
// picks it up at once; unchanged entries keep their next slot, changed
// ones restart from now without firing, removed ones stop.
func (s *Scheduler) Reload(sc *config.Config) error {
	set, err := newEntrySet(sc)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.entries.Store(set)
	s.delta, s.full = nil, true
	s.mu.Unlock()
	s.cfg.Metrics.setEntries(sc)
	s.notify()
	return nil
}

// ReloadDelta is Reload for a config that differs from the running one
// only in the entries named (added, changed or removed): only those are
// compiled, and the loop reschedules only those, so one change among a
// million entries costs a copy of the index, not a rebuild of the heap.
func (s *Scheduler) ReloadDelta(sc *config.Config, changed []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.entries.Load() // never nil: New applied a first config
	set, ok, err := cur.withChanges(sc, changed)
	if err != nil {
		return err
	}
	s.entries.Store(set)
	if !ok {
		s.log.Error("a delta config differs beyond its changed entries; applying it whole", "changed", len(changed))
		s.delta, s.full = nil, true
	}
	if !s.full {
		if s.delta == nil {
			s.delta = map[string]struct{}{}
		}
		for _, name := range changed {
			s.delta[name] = struct{}{}
		}
		// A loop that does not take them (a standby has none) must not
		// make this grow: past a bound the next apply is a full one.
		if len(s.delta) > maxDelta {
			s.delta, s.full = nil, true
		}
	}
	s.cfg.Metrics.setEntriesDelta(sc, changed)
	s.notify()
	return nil
}

// names returns the set's names, for a check of every state: a binary
// search at a million entries takes ~3 µs (a cache miss at each step
// down), a map made for the check ~0.3 µs a name, and it is dropped after.
func (s *entrySet) names() map[string]struct{} {
	m := make(map[string]struct{}, len(s.list))
	for _, e := range s.list {
		m[e.Name] = struct{}{}
	}
	return m
}

func cmpName(e *entry, name string) int { return strings.Compare(e.Name, name) }

// newEntrySet compiles every entry of sc.
func newEntrySet(sc *config.Config) (*entrySet, error) {
	set := &entrySet{list: make([]*entry, len(sc.Entries)), config: sc}
	for i, e := range sc.Entries {
		// Templates are compiled when a slot comes due (prepare): with
		// 100k entries, most would otherwise sit in memory long before
		// they are needed.
		if err := ValidateEntry(e); err != nil {
			return nil, err
		}
		set.list[i] = &entry{Entry: e}
	}
	if !slices.IsSortedFunc(set.list, func(a, b *entry) int { return strings.Compare(a.Name, b.Name) }) {
		return nil, fmt.Errorf("scheduler: the config's entries are not in name order")
	}
	return set, nil
}

// withChanges is s for sc, which differs from s's config only in the
// entries named: those are compiled anew, the rest keep their entry (and
// its definition, the same by the caller's word). The runs between
// changed names are copied whole. ok is false when sc has more or fewer
// entries than that makes (a caller's mistake): the set is then sc's,
// compiled whole, for the loop to apply whole.
func (s *entrySet) withChanges(sc *config.Config, changed []string) (set *entrySet, ok bool, err error) {
	names := slices.Clone(changed)
	slices.Sort(names)
	names = slices.Compact(names)
	list := make([]*entry, 0, len(sc.Entries))
	j := 0
	for _, name := range names {
		k, found := slices.BinarySearchFunc(s.list[j:], name, cmpName)
		list = append(list, s.list[j:j+k]...)
		if j += k; found {
			j++ // replaced or removed
		}
		if e := sc.Entry(name); e != nil {
			if err := ValidateEntry(e); err != nil {
				return nil, false, err
			}
			list = append(list, &entry{Entry: e})
		}
	}
	list = append(list, s.list[j:]...)
	if len(list) != len(sc.Entries) {
		set, err := newEntrySet(sc)
		return set, false, err
	}
	return &entrySet{list: list, config: sc}, true, nil
}

// maxDelta is the most changed names kept for the loop's next apply.
const maxDelta = 100000

// takeDelta returns the running set and what changed since the loop
// last took it: the names, or full when the whole set must be applied.
func (s *Scheduler) takeDelta() (set *entrySet, names map[string]struct{}, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, names, full = s.entries.Load(), s.delta, s.full
	s.delta, s.full = nil, false
	return set, names, full
}

// notify wakes the loop to apply the running set.
func (s *Scheduler) notify() {
	select {
	case s.reload <- struct{}{}:
	default:
	}
}

// Config returns the running config.
func (s *Scheduler) Config() *config.Config { return s.entries.Load().config }

// PublishError returns the last publish failure, or nil when publishing
// works. Readiness reports it.
func (s *Scheduler) PublishError() error {
	if p := s.publishErr.Load(); p != nil {
		return *p
	}
	return nil
}

// PersistError returns the last state write's failure while this replica
// leads and etcd refuses writes, or nil. Readiness reports it.
func (s *Scheduler) PersistError() error {
	if p := s.persist.Load(); p != nil {
		return p.writeError()
	}
	return nil
}

func (s *Scheduler) setPublishErr(err error) {
	if err == nil {
		s.publishErr.Store(nil)
		s.failingSince.Store(0)
		return
	}
	s.publishErr.Store(&err)
	s.failingSince.CompareAndSwap(0, s.cfg.Clock.Now().UnixNano())
}

// PublishFailingSince is when this term's publishes began to fail in a
// row (zero while they work, or nothing was due).
func (s *Scheduler) PublishFailingSince() time.Time {
	if n := s.failingSince.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// item is an entry's next slot in the heap.
type item struct {
	e    *entry
	slot time.Time // nominal slot: the identity
	// due is slot + jitter, when to publish, in Unix nanoseconds
	// (dueNs), and key the first 8 bytes of the entry's name: a burst's
	// slots are all due at once, and comparing them through the entry's
	// name was a cache miss or three per comparison, 8% of a busy
	// leader's CPU. Both keep the item in 64 bytes, as a million are.
	due   int64
	key   uint64
	index int
}

// newItem is e's item for slot.
func newItem(e *entry, slot time.Time) *item {
	it := &item{e: e, key: nameKey(e.Name)}
	it.set(slot)
	return it
}

// set moves it to slot.
func (it *item) set(slot time.Time) {
	it.slot, it.due = slot, dueNs(slot.Add(jitter(it.e.Entry, slot)))
}

// dueTime is it's due time.
func (it *item) dueTime() time.Time { return time.Unix(0, it.due) }

// dueNs is t in Unix nanoseconds, and the last of them for a time past
// 2262 (which UnixNano cannot hold): such a slot is never due.
func dueNs(t time.Time) int64 {
	if t.After(maxDue) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

var maxDue = time.Unix(0, math.MaxInt64)

// nameKey is name's first 8 bytes, big-endian and zero-padded: two keys
// that differ order as their names do.
func nameKey(name string) uint64 {
	var b [8]byte
	copy(b[:], name)
	return binary.BigEndian.Uint64(b[:])
}

type slotHeap []*item

func (h slotHeap) Len() int { return len(h) }
func (h slotHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	switch {
	case a.due != b.due:
		return a.due < b.due
	case a.key != b.key:
		return a.key < b.key
	}
	return a.e.Name < b.e.Name
}
func (h slotHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *slotHeap) Push(x any)   { it := x.(*item); it.index = len(*h); *h = append(*h, it) }
func (h *slotHeap) Pop() any {
	old := *h
	n := len(old)
	it := old[n-1]
	old[n-1] = nil
	it.index = -1
	*h = old[:n-1]
	return it
}

// jitter delays a slot by an amount derived from (entry, slot), so every
// replica computes the same delay.
func jitter(e *config.Entry, slot time.Time) time.Duration {
	if e.Jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(e.Name))
	var b [8]byte
	n := slot.UnixNano()
	for i := range b {
		b[i] = byte(n >> (8 * i))
	}
	h.Write(b[:])
	return time.Duration(h.Sum64() % uint64(e.Jitter))
}

// pendingFire is a fire waiting to be published.
type pendingFire struct {
	e      *entry
	slot   time.Time
	due    time.Time
	manual bool
	// failed: a publish of it failed already; what follows is a retry.
	failed bool
	req    *store.Request // the trigger request it answers
	bf     *backfillRun   // the backfill it is a slot of
}

// DefaultBatchSize is Config.BatchSize unless set.
const DefaultBatchSize = 2048

// loop is one term's state, owned by Run's goroutine.
type loop struct {
	s       *Scheduler
	term    Term
	guard   election.Fence
	set     *entrySet
	heap    slotHeap
	states  map[string]*store.EntryState
	pending []pendingFire
	persist *persister
	// metricsMode is the Metrics' mode the entries' cached counters were
	// made in (syncMetrics).
	metricsMode uint32
	// free holds publications to reuse; pubSeq is the last one's number
	// (publishPending).
	free     []*publication
	pubSeq   uint64
	gc       gcGap
	backoff  *backoff.ExponentialBackOff // publish retries while the broker fails
	requests <-chan struct{}
	dirty    map[string]bool    // entries changed in the batch being published
	changed  []store.EntryState // their new state, handed to the persister
	baseline []store.EntryState // Since baselines to persist
	fireLog  fireLog
	// collectDue's: the slots each entry added to the pass (made once an
	// entry adds a second), the items it set aside, and its late-slot
	// log line, summarised.
	passCount map[*entry]int
	setAside  []*item
	lateLog   lateLog
	failLog   repeatLog // complete's "publish failed"
	// behind and runaway are the entries flagged (entryhealth.go), by
	// name: the flags outlive a reload that keeps the entry.
	behind  map[string]bool
	runaway map[string]bool
	// nextSweep is when the loop next looks for removed entries past
	// their grace (sweepRemoved).
	nextSweep time.Time
	// reports are the outcome feed's (nil: outcomes not tracked);
	// unfinished holds the entries whose newest run has not ended, which
	// sweepLost looks at every lostSweep.
	// mustFlush: the batch changed a max_runs count, which is written
	// before the next batch.
	mustFlush bool
	// urgent: a change among dirty must be written at once (saveNow).
	urgent        bool
	reports       <-chan outcome.Report
	unfinished    map[string]bool
	nextLostSweep time.Time
	// backfills are the backfills this term runs, by id; bfRetry the
	// backfill requests whose start failed and is retried; feedWait is
	// when the backfills next need the loop (0: they do not).
	backfills map[string]*backfillRun
	bfRetry   []store.Request
	feedWait  time.Duration
	// prepare's: its walk's stack, kept between calls; when it last ran,
	// and whether it left templates to compile.
	prepStack  []int
	preparedAt time.Time
	prepMore   bool
}

// sweepEvery is how often a long-lived term drops the state and broker
// keys of entries removed longer than RemovedGrace ago; a new term does
// it at its start.
const sweepEvery = time.Hour

// nextSweepAt is when a sweep done at now is next due: sweepEvery later,
// moved to the second half of its minute. A sweep walks every entry's state
// on the loop (a few hundred ms at a million entries), and crontab slots
// fall due together at a minute's start.
func nextSweepAt(now time.Time) time.Time {
	t := now.Add(sweepEvery)
	if t.Second() < 30 {
		t = t.Truncate(time.Minute).Add(30 * time.Second)
	}
	return t
}

// ErrTermEnded is returned by Run when the loop stopped because leadership
// ended (a stale fence or a refused write), not because of its context.
var ErrTermEnded = errors.New("scheduler: term ended")

// Run is the loop for one term. It returns when ctx ends (after finishing
// the publish in flight and persisting it), or with ErrTermEnded when the
// fence or etcd says another replica leads.
func (s *Scheduler) Run(ctx context.Context, term Term) error {
	l := &loop{s: s, term: term, guard: term.Fence, dirty: map[string]bool{}}
	termEnded := s.cfg.Metrics.termStarted(ctx, s.entries.Load(), term, s.cfg.Clock.Now())
	defer termEnded()
	table, err := l.begin(ctx)
	if err != nil {
		return err
	}
	// The persister owns the table from here; the loop keeps its own view
	// in l.states and hands it changes.
	stopPersister := l.startPersister(ctx, table)
	defer stopPersister()

	reqs, rev, err := s.cfg.Store.PendingRequests(ctx)
	if err != nil {
		s.cfg.Metrics.EtcdErrors.Inc()
		s.log.Warn("list admin requests", "err", err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	l.requests = s.cfg.Store.WatchRequests(wctx, rev)
	l.handleRequests(ctx, reqs)
	s.log.Info("scheduling", "token", term.Token, "entries", len(l.set.list), "catchup_fires", len(l.pending))
	return l.run(ctx)
}

// begin starts a term: it loads the state and raises the fence before
// anything else (from then on a deposed leader's publishes are refused),
// prunes removed entries, and schedules every entry with its catch-up.
// It returns the table the persister takes over.
func (l *loop) begin(ctx context.Context) (*store.Table, error) {
	s := l.s
	var (
		table *store.Table
		err   error
	)
	if err = s.retry(ctx, "load state", func() error {
		table, err = s.cfg.Store.Load(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	if err := s.retry(ctx, "raise fence", func() error { return s.cfg.Dispatcher.RaiseFence(ctx, l.term.Token) }); err != nil {
		return nil, err
	}
	now := s.cfg.Clock.Now()
	if !l.term.Elected.IsZero() && l.term.Elected.Before(now) {
		now = l.term.Elected
	}
	l.set, _, _ = s.takeDelta() // the term starts from the whole set
	s.applied.Store(l.set)
	// Removed entries are marked, or deleted after their grace, in the
	// table itself: the persister's first write stores that.
	configured := l.set.names()
	_, gone := table.Prune(func(n string) bool { _, ok := configured[n]; return ok }, now, s.cfg.RemovedGrace)
	l.states = table.States()
	l.nextSweep = nextSweepAt(now)
	l.unfinished = map[string]bool{}
	if f := s.cfg.Outcomes; f != nil {
		l.reports = f.Reports()
		l.adoptUnrecorded(ctx, now)
		l.loadOutcomes()
	}
	if err := l.forget(ctx, gone); err != nil {
		return nil, err
	}
	for _, e := range l.set.list {
		e.it = nil // a last term's
		l.startEntry(e, l.states[e.Name], now, true)
	}
	heap.Init(&l.heap)
	// The first baselines (every entry of a first start) go straight
	// into the table, not through the persister's change map.
	for _, st := range l.baseline {
		table.Set(st.Clone()) // the table is the persister's from here
	}
	l.baseline = nil
	if before := table.Buckets(); table.Fit() {
		s.log.Info("state table moved to another layout: written whole once",
			"entries", table.Len(), "buckets_before", before, "buckets", table.Buckets())
	}
	return table, nil
}

// startPersister runs the term's persister on table until the returned
// stop is called. It outlives ctx, so the loop's last persist runs.
func (l *loop) startPersister(ctx context.Context, table *store.Table) (stop func()) {
	s := l.s
	pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
	l.persist = newPersister(s.cfg.Store, l.guard, table, s.cfg)
	s.persist.Store(l.persist)
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() { defer pwg.Done(); l.persist.run(pctx) }()
	return func() {
		pcancel()
		pwg.Wait()
		s.persist.CompareAndSwap(l.persist, nil)
	}
}

// run is the term's loop: publish what is pending, collect what is due,
// and wait for the next slot, a reload, an admin request or the end.
func (l *loop) run(ctx context.Context) error {
	s := l.s
	// The timer is armed only where the loop waits on it: an armed timer
	// then means an idle loop, which tests rely on. So it is made at the
	// first wait, not armed and stopped here.
	var timer clockwork.Timer
	arm := func(d time.Duration) {
		if timer == nil {
			timer = s.cfg.Clock.NewTimer(d)
			return
		}
		timer.Reset(d)
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		l.reportDue()
		if err := l.persist.failed(); err != nil {
			return err
		}
		if l.reports != nil {
			now := s.cfg.Clock.Now()
			l.drainReports(now)
			l.sweepLost(now)
		}
		if now := s.cfg.Clock.Now(); !now.Before(l.nextSweep) {
			if err := l.sweepRemoved(ctx, now); err != nil {
				return err
			}
		}
		if len(l.backfills) > 0 || len(l.bfRetry) > 0 {
			l.feedWait = l.feedBackfills(ctx, s.cfg.Clock.Now())
		} else {
			l.feedWait = 0
		}
		if len(l.pending) > 0 {
			err := l.publishPending(ctx)
			switch {
			case err == nil:
				// Control between slices of work: with slots always due
				// the loop never reaches its wait below, and a reload, a
				// DELETE, a pause or the end of the term would otherwise
				// wait for the work to run out.
				if _, done, err := l.serve(ctx, nil, false); done {
					return err
				}
				continue
			case errors.Is(err, ErrTermEnded):
				return err
			case ctx.Err() != nil:
				return l.finish()
			}
			// Transient: keep the slots pending and retry with backoff,
			// serving control meanwhile (a broker outage must not hold a
			// DELETE for the length of the backoff).
			arm(l.nextBackoff())
			for fired := false; !fired; {
				var done bool
				if fired, done, err = l.serve(ctx, timer.Chan(), true); done {
					return err
				}
			}
			// Slots that came due meanwhile join the retry, up to a
			// batch: one fire that keeps failing (a queue key of the
			// wrong type) then delays the others by the backoff instead
			// of stopping them, and a broker that is down leaves at most
			// a batch pending, not every slot of the outage. Those the
			// outage made late go through their catch-up policy, as
			// late slots found in the heap do.
			now := s.cfg.Clock.Now()
			l.catchUpPending(now)
			l.collectDue(now)
			continue
		}
		l.collectDue(s.cfg.Clock.Now())
		if len(l.pending) > 0 {
			continue
		}
		more := l.prepare(s.cfg.Clock.Now())
		// Measured from the clock as the timer is armed: time that passed
		// since now was read must not push the deadline back.
		wait := time.Hour
		if len(l.heap) > 0 {
			wait = max(time.Duration(l.heap[0].due-s.cfg.Clock.Now().UnixNano()), 0)
		}
		if more {
			wait = min(wait, prepareAgain)
		}
		if len(l.unfinished) > 0 {
			wait = min(wait, max(l.nextLostSweep.Sub(s.cfg.Clock.Now()), 0))
		}
		if l.feedWait > 0 {
			wait = min(wait, l.feedWait)
		} else if len(l.backfills) > 0 {
			wait = min(wait, backfillSave) // progress to write, or the end to record
		}
		arm(wait)
		if _, done, err := l.serve(ctx, timer.Chan(), true); done {
			return err
		}
		if !timer.Stop() {
			select {
			case <-timer.Chan():
			default:
			}
		}
	}
}

// serve handles what needs the loop besides its slots: the end of the
// term, a reload, admin requests, a worker's report, the persister's
// failure. With block it waits for one of them or for timer (fired says
// the timer it was); without, it handles one that is ready, if any, and
// returns at once. done means the term is over, with run's result.
func (l *loop) serve(ctx context.Context, timer <-chan time.Time, block bool) (fired, done bool, err error) {
	s := l.s
	if !block {
		select {
		case <-ctx.Done():
		case <-s.reload:
			l.applyReload(s.cfg.Clock.Now())
			l.reloadBackfills(ctx, s.cfg.Clock.Now())
			return false, false, nil
		case _, ok := <-l.requests:
			done, err = l.requestsChanged(ctx, ok)
			return false, done, err
		case r := <-l.reports:
			l.applyReports(r, s.cfg.Clock.Now())
			return false, false, nil
		case <-l.persist.errc:
			return false, false, nil
		default:
			return false, false, nil
		}
		return false, true, l.finish()
	}
	select {
	case <-ctx.Done():
		return false, true, l.finish()
	case <-timer:
		return true, false, nil
	case <-s.reload:
		l.applyReload(s.cfg.Clock.Now())
		l.reloadBackfills(ctx, s.cfg.Clock.Now())
	case _, ok := <-l.requests:
		done, err = l.requestsChanged(ctx, ok)
		return false, done, err
	case r := <-l.reports:
		l.applyReports(r, s.cfg.Clock.Now())
	case <-l.persist.errc:
	}
	return false, false, nil
}

// requestsChanged applies the admin requests after their watch said they
// changed (ok false: the watch closed).
func (l *loop) requestsChanged(ctx context.Context, ok bool) (done bool, err error) {
	s := l.s
	if !ok {
		l.requests = nil
		if ctx.Err() == nil {
			return true, fmt.Errorf("%w: request watch closed", ErrTermEnded)
		}
		return false, nil
	}
	reqs, _, err := s.cfg.Store.PendingRequests(ctx)
	if err != nil {
		s.cfg.Metrics.EtcdErrors.Inc()
		s.log.Warn("list admin requests", "err", err)
		return false, nil
	}
	l.handleRequests(ctx, reqs)
	return false, nil
}

// retry runs op until it succeeds or ctx ends, backing off.
func (s *Scheduler) retry(ctx context.Context, what string, op func() error) error {
	b := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for {
		err := op()
		if err == nil {
			return nil
		}
		if errors.Is(err, broker.ErrStale) || errors.Is(err, store.ErrNotLeader) {
			return fmt.Errorf("%w: %s: %w", ErrTermEnded, what, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := b.NextBackOff()
		s.log.Warn("retrying", "op", what, "err", err, "backoff", wait.String())
		t := s.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.Chan():
		}
	}
}

func (l *loop) nextBackoff() time.Duration {
	if l.backoff == nil {
		l.backoff = retry.Backoff(50*time.Millisecond, 2*time.Second)
	}
	return l.backoff.NextBackOff()
}

// startEntry schedules an entry at the start of a term (catchUp) or when a
// reload adds or changes it.
func (l *loop) startEntry(e *entry, st *store.EntryState, now time.Time, catchUp bool) {
	if !e.Enabled {
		return
	}
	owed := st != nil && !st.CatchupFrom().IsZero()
	backfill := !owed && !e.StartAt().IsZero() && e.Catchup == config.CatchupAll
	if !backfill && (!owed || !catchUp) {
		// From now on this entry's slots are owed: record that before its
		// first fire, so a leader that takes over before then still owes
		// it (and owes nothing from before a change).
		if st == nil {
			st = l.state(e.Name)
		}
		st.Since = now
		l.baseline = append(l.baseline, *st)
	}
	e.sched = Anchored(e.Entry, st, now)
	plan := planCatchup(e.Entry, e.sched, st, now)
	l.clearFlags(e.Name) // a new or changed definition starts afresh
	if why := plan.insane(e.Entry, now); why != "" {
		l.stopRunaway(e, why, now)
		return
	}
	l.applyPlan(e, plan)
	m := l.s.cfg.Metrics
	if plan.next.IsZero() {
		return // fired its last slot (a past one-off)
	}
	if after := e.sched.Next(plan.next); !after.IsZero() {
		m.setPeriod(e.Name, after.Sub(plan.next))
	}
	next := newItem(e, plan.next)
	e.it = next
	l.s.cfg.Metrics.scheduled(e.Name, next.dueTime())
	l.heap = append(l.heap, next)
	next.index = len(l.heap) - 1
}

// collectDue moves every due slot from the heap to pending, advancing each
// entry to its next slot. An entry adds at most entryShare slots to one
// pass: one whose slots are always due (an interval the loop cannot
// sustain) is set aside for the rest of the pass, so the others' slots
// still go out on time, and it is flagged as behind until it catches up.
func (l *loop) collectDue(now time.Time) {
	defer l.lateLog.flush(l.s.log, now)
	nowNs := now.UnixNano()
	clear(l.passCount)
	for len(l.heap) > 0 && l.heap[0].due <= nowNs && len(l.pending) < l.s.cfg.BatchSize {
		it := l.heap[0]
		e := it.e
		if time.Duration(nowNs-it.due) > stepLateness {
			l.lateLog.add(l.catchUpLate(it, now))
			continue
		}
		if st := l.states[e.Name]; st != nil && st.Paused {
			l.s.cfg.Metrics.Missed.WithLabelValues(e.Name, ReasonPaused).Inc()
		} else {
			due := it.dueTime()
			l.pending = append(l.pending, pendingFire{e: e, slot: it.slot, due: due})
			l.s.cfg.Metrics.queued(e.Name, due)
		}
		next := e.sched.Next(it.slot)
		if next.IsZero() {
			heap.Pop(&l.heap)
			e.it = nil
			l.s.cfg.Metrics.scheduled(e.Name, time.Time{})
			continue
		}
		if !next.After(it.slot) {
			l.stopRunaway(e, fmt.Sprintf("its schedule gave %s after %s", schedule.FormatSlot(next), schedule.FormatSlot(it.slot)), now)
			continue
		}
		it.set(next)
		l.s.cfg.Metrics.scheduled(e.Name, it.dueTime())
		if it.due > nowNs {
			l.caughtUp(e, now)
			heap.Fix(&l.heap, 0)
			continue
		}
		// Still due: the entry is behind its own schedule.
		if l.passCount == nil {
			l.passCount = map[*entry]int{}
		}
		if l.passCount[e]++; l.passCount[e] < entryShare {
			heap.Fix(&l.heap, 0)
			continue
		}
		heap.Pop(&l.heap)
		l.setAside = append(l.setAside, it)
		l.fallBehind(e, now)
	}
	for _, it := range l.setAside {
		heap.Push(&l.heap, it)
	}
	clear(l.setAside)
	l.setAside = l.setAside[:0]
}

// entryShare is the most slots one entry adds to a collectDue pass. A
// regular entry adds one; a short interval after a slow burst a few.
const entryShare = 8

// applyPlan queues a catch-up plan's fires and counts what it dropped.
func (l *loop) applyPlan(e *entry, plan catchupPlan) {
	m := l.s.cfg.Metrics
	for _, d := range plan.dropped {
		m.Missed.WithLabelValues(e.Name, d.reason).Add(float64(d.count))
	}
	for _, s := range plan.fire {
		l.pending = append(l.pending, pendingFire{e: e, slot: s, due: s})
		m.queued(e.Name, s)
	}
}

// stepLateness is how late a slot may be found and still fire as a
// regular slot. Later than that, the wall clock stepped forward (NTP, a VM
// resumed) or the loop stalled, and the slots since go through the
// entry's catch-up policy, as after a failover: catchup: once fires the
// latest, skip none, all each within the window.
const stepLateness = 30 * time.Second

// catchUpPending applies each entry's catch-up policy to its pending
// scheduled slots over stepLateness late, which a publish that kept
// failing left there: the one rule for a late slot, wherever it waited.
// catchup: all keeps them (within catchup_window), once the latest, skip
// none. Manual fires and backfills are kept as they are.
func (l *loop) catchUpPending(now time.Time) {
	late := func(p pendingFire) bool { return p.late(now) }
	var latest map[*entry]time.Time
	for _, p := range l.pending {
		if late(p) && p.e.Catchup == config.CatchupOnce {
			if latest == nil {
				latest = map[*entry]time.Time{}
			}
			if p.slot.After(latest[p.e]) {
				latest[p.e] = p.slot
			}
		}
	}
	m := l.s.cfg.Metrics
	kept := l.pending[:0]
	for _, p := range l.pending {
		reason := ""
		if late(p) {
			switch p.e.Catchup {
			case config.CatchupSkip:
				reason = ReasonSkip
			case config.CatchupOnce:
				if !p.slot.Equal(latest[p.e]) {
					reason = ReasonOnce
				}
			default:
				if p.due.Before(now.Add(-p.e.CatchupWindow)) {
					reason = ReasonWindow
				}
			}
		}
		if reason == "" {
			kept = append(kept, p)
			continue
		}
		m.Missed.WithLabelValues(p.e.Name, reason).Inc()
	}
	clear(l.pending[len(kept):])
	l.pending = kept
}

// catchUpLate applies e's catch-up policy to it's slot and every slot
// after it up to now, and moves it to the next slot. It returns how many
// slots it queued.
func (l *loop) catchUpLate(it *item, now time.Time) int {
	e := it.e
	prev := store.EntryState{LastSlot: it.slot.Add(-time.Nanosecond)}
	if st := l.states[e.Name]; st != nil {
		prev.Paused = st.Paused
	}
	plan := planCatchup(e.Entry, e.sched, &prev, now)
	if why := plan.insane(e.Entry, now); why != "" {
		l.stopRunaway(e, why, now)
		return 0
	}
	l.applyPlan(e, plan)
	m := l.s.cfg.Metrics
	if plan.next.IsZero() {
		heap.Remove(&l.heap, it.index)
		e.it = nil
		m.scheduled(e.Name, time.Time{})
		return len(plan.fire)
	}
	it.set(plan.next)
	m.scheduled(e.Name, it.dueTime())
	heap.Fix(&l.heap, it.index)
	return len(plan.fire)
}

// publishPending publishes pending fires in batches, then hands their new
// state to the persister. Fires whose publish failed stay pending.
//
// A burst publishes batch after batch, and the loop's own share of a
// batch (recording its results, collecting and building the next) used to
// leave Redis idle: at 20,000 entries due at once, ~6 of each batch's
// ~22 ms. So the next batch is launched while the current one is out, when
// nothing one decides can change the other: both hold only scheduled
// slots of entries without max_runs or an overlap policy, no entry is in
// both, and no state must be written between them (PersistEachBatch).
// Publishes still run one at a time, in launch order.
//
// A batch the broker took whole is recorded only once the chain ends, so
// the burst goes out first and the bookkeeping (~2 µs a fire: states,
// metrics, the console's timeline) follows it. A later batch is launched
// only once every batch but the one just before it is known to have gone
// out whole, so a failed slot is still retried before any later slot of
// its entry (whose mark would make the earlier one a duplicate).
func (l *loop) publishPending(ctx context.Context) error {
	cur := l.launch(ctx, nil)
	var out []*publication // gone out whole, to be recorded
	for chained := 1; ; chained++ {
		var next *publication
		if chained < maxChain && l.chains(cur) {
			if len(l.pending) == 0 {
				l.collectDue(l.s.cfg.Clock.Now())
			}
			if l.disjoint(cur) {
				next = l.launch(ctx, cur)
			}
		}
		<-cur.done
		if next != nil && cur.whole() {
			out = append(out, cur)
			cur = next
			continue
		}
		out = append(out, cur)
		if next != nil {
			out = append(out, next)
		}
		err := l.record(ctx, out)
		if len(out) > 1 {
			l.gc.end() // a burst: collect in the gap after it
		}
		return err
	}
}

// record completes a chain's publications in launch order and frees
// them. Ending the term wins over another error.
func (l *loop) record(ctx context.Context, pubs []*publication) error {
	defer func() {
		for _, pub := range pubs {
			<-pub.done
			l.free = append(l.free, pub)
		}
	}()
	var first error
	for i, pub := range pubs {
		err := l.complete(ctx, pub, i == len(pubs)-1)
		if errors.Is(err, ErrTermEnded) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// maxChain is the most batches publishPending publishes back to back
// (~0.35 s at 20,000 fires a second) before the loop looks at its
// requests, reports and reloads again.
const maxChain = 16

// publication is one batch handed to the Dispatcher, from its launch to
// the loop recording its results (complete). Freed ones are kept for the
// next, so a burst's batches reuse their buffers.
type publication struct {
	seq     uint64
	batch   []pendingFire
	fires   []celery.Fire
	results []broker.Result
	// plain: every fire is plainFire's, whose result changes nothing
	// another batch decides.
	plain bool
	// err and at are Publish's error and when it returned; done is closed
	// then.
	err  error
	at   time.Time
	done chan struct{}
}

// launch takes a batch off the front of pending and publishes it in its
// own goroutine, after prev's publish (if any) has returned. The caller
// must complete it.
func (l *loop) launch(ctx context.Context, prev *publication) *publication {
	s := l.s
	n := min(len(l.pending), s.cfg.BatchSize)
	l.pubSeq++
	var pub *publication
	if n := len(l.free); n > 0 {
		pub, l.free = l.free[n-1], l.free[:n-1]
	} else {
		pub = &publication{}
	}
	pub.seq = l.pubSeq
	now := s.cfg.Clock.Now()
	pub.batch = append(pub.batch[:0], l.holdOverlapping(l.pending[:n], now)...)
	// Drop the batch from the queue without copying what is left.
	if rest := l.pending[n:]; len(rest) > 0 {
		l.pending = rest
	} else if cap(l.pending) <= 4*s.cfg.BatchSize {
		// The queue is empty: the next batch reuses its array (a new one
		// every batch was a tenth of a busy leader's allocations). A
		// larger one, left by a catch-up, goes.
		clear(l.pending[:n])
		l.pending = l.pending[:0]
	} else {
		l.pending = nil
	}
	pub.fires = pub.fires[:0]
	pub.plain = true
	for _, p := range pub.batch {
		p.e.pubSeq = pub.seq
		if !plainFire(p) {
			pub.plain = false
		}
		f := celery.Fire{Task: l.compiled(p.e), Slot: p.slot, Manual: p.manual, Late: p.late(now)}
		if p.req != nil {
			f.Request = p.req.ID
		}
		if p.bf != nil {
			f.Backfill = p.bf.job.ID
		}
		pub.fires = append(pub.fires, f)
	}
	pub.results = append(pub.results[:0], make([]broker.Result, len(pub.batch))...)
	pub.err = nil
	pub.done = make(chan struct{})
	if len(pub.batch) == 0 {
		pub.at = s.cfg.Clock.Now()
		close(pub.done)
		return pub
	}
	// prev's channel is read here, not in the goroutine: by the time that
	// runs, prev may have completed and its buffers been launched again.
	var after <-chan struct{}
	if prev != nil {
		after = prev.done
	}
	go func() {
		defer close(pub.done)
		if after != nil {
			<-after
		}
		pub.err = s.cfg.Dispatcher.Publish(ctx, l.term.Token, pub.fires, pub.results)
		pub.at = s.cfg.Clock.Now()
	}()
	return pub
}

// plainFire says whether p decides nothing from the state of its entry's
// earlier fires: a scheduled slot of an entry without max_runs (counted
// runs) or an overlap policy (a run in progress holds the next).
func plainFire(p pendingFire) bool {
	return !p.manual && p.req == nil && p.bf == nil && p.e.MaxRuns() <= 0 && !p.e.HoldsOverlap()
}

// whole says whether the broker took every fire of pub (pushed or a
// duplicate).
func (pub *publication) whole() bool {
	if pub.err != nil {
		return false
	}
	for _, r := range pub.results {
		if r != broker.ResultOK && r != broker.ResultDuplicate {
			return false
		}
	}
	return true
}

// chains says whether the batch after cur may be launched before cur's
// results are recorded: cur is plain, and no state write must land
// between the two publishes.
func (l *loop) chains(cur *publication) bool {
	return cur.plain && !l.s.cfg.PersistEachBatch && !l.mustFlush
}

// disjoint says whether the next batch is plain and shares no entry with
// cur.
func (l *loop) disjoint(cur *publication) bool {
	n := min(len(l.pending), l.s.cfg.BatchSize)
	if n == 0 {
		return false
	}
	for _, p := range l.pending[:n] {
		if p.e.pubSeq == cur.seq || !plainFire(p) {
			return false
		}
	}
	return true
}

// complete waits for pub's publish and records its results: each entry's
// state, metrics and log lines. Fires that failed go back to the front of
// pending. save hands the states changed so far to the persister.
func (l *loop) complete(ctx context.Context, pub *publication, save bool) error {
	<-pub.done
	s := l.s
	m := s.cfg.Metrics
	err, now := pub.err, pub.at
	l.syncMetrics()
	logFires := s.cfg.FireLogLimit > 0 && s.log.Enabled(ctx, slog.LevelInfo)
	var failed []pendingFire
	for i, p := range pub.batch {
		r := pub.results[i]
		dedup := r == broker.ResultDuplicate
		if dedup {
			// An earlier term pushed this slot and died before recording
			// it: the slot was published, once, and that is its result.
			// The refusal is only worth a counter.
			m.Deduplicated.Inc()
			r = broker.ResultOK
		}
		if r == broker.ResultError && p.failed {
			// A retry: the slot was counted at its first failure, and an
			// outage of N slots stays N failed slots, not N × attempts.
			m.PublishRetries.Inc()
			m.published(p.e.Name, "error", p.manual, now, err) // its last error, for /status
		} else {
			p.e.countFire(m, r, p.manual, p.bf != nil, now, err)
			if s.cfg.Observer != nil {
				s.cfg.Observer(p.e.Name, p.slot, r, now.Sub(p.due), p.manual || p.bf != nil)
			}
		}
		switch {
		case p.bf != nil && r == broker.ResultOK:
			// A past slot: the entry's own state (its last slot, its
			// runs and their outcomes) is not the backfill's.
			l.backfillPublished(p)
			if logFires && l.fireLog.allow(now, s.cfg.FireLogLimit, r, true) {
				id := pub.fires[i].ID
				s.log.Info("fired", "entry", p.e.Name, "slot", p.slot.UTC().Format(time.RFC3339Nano), "token", l.term.Token,
					"task_id", string(id[:]), "result", r.String(), "backfill", p.bf.job.ID, "source", p.e.Source)
			}
		case r == broker.ResultOK:
			lag := now.Sub(p.due)
			if !p.manual {
				m.FireLag.Observe(lag.Seconds())
			}
			id := pub.fires[i].ID
			if !p.manual {
				st := l.state(p.e.Name)
				if p.slot.After(st.LastSlot) {
					st.LastSlot = p.slot
					// A duplicate of a slot after the stored one is the
					// previous leader's unrecorded run: it counts too.
					if p.e.MaxRuns() > 0 {
						st.Runs++
						l.mustFlush = true
						if st.Runs >= uint64(p.e.MaxRuns()) {
							l.finishEntry(p.e)
						}
					}
				}
				st.Imported = false
				l.dirty[p.e.Name] = true
			}
			l.recordPublished(p, id, now)
			l.dropTemplate(p)
			if logFires {
				if l.fireLog.allow(now, s.cfg.FireLogLimit, r, p.manual) {
					s.log.Info("fired", "entry", p.e.Name, "slot", p.slot.UTC().Format(time.RFC3339Nano), "token", l.term.Token,
						"task_id", string(id[:]), "lag", lag.String(), "result", r.String(), "deduplicated", dedup, "manual", p.manual, "source", p.e.Source)
				}
			}
			if p.req != nil {
				l.persist.complete(*p.req, nil)
			}
		case r == broker.ResultStale:
			stale := 0
			for _, r := range pub.results {
				if r == broker.ResultStale {
					stale++
				}
			}
			s.log.Warn("stale publish refused", "token", l.term.Token, "fires", stale)
			return fmt.Errorf("%w: fence raised by a newer leader", ErrTermEnded)
		default:
			p.failed = true
			failed = append(failed, p)
		}
	}
	if logFires {
		l.fireLog.summarise(s.log, now, l.term.Token)
	}
	// One state per entry per batch, however often it fired in it.
	if save && len(l.dirty) > 0 {
		l.saveDirty()
		// While etcd refuses writes, waiting for each batch's write would
		// make every fire late: fire on time, as with Redis, and let the
		// state catch up (the broker's journal covers the gap).
		if (s.cfg.PersistEachBatch || l.mustFlush) && l.persist.writeError() == nil {
			// A max_runs count is written before the entry fires again,
			// so a new leader cannot count short and run once too often.
			l.mustFlush = false
			fctx, cancel := context.WithTimeout(ctx, max(s.cfg.StateInterval, writeAttemptTimeout))
			if ferr := l.persist.flush(fctx, true); ferr != nil && !errors.Is(ferr, ErrTermEnded) {
				s.log.Warn("batch state not persisted before the next batch", "err", ferr)
			}
			cancel()
		}
	}
	// Failures, rare, go back in front (in slot order).
	if len(failed) > 0 {
		l.pending = append(failed, l.pending...)
	}
	if err != nil {
		if errors.Is(err, broker.ErrStale) {
			return fmt.Errorf("%w: %w", ErrTermEnded, err)
		}
		m.RedisErrors.Inc()
		s.setPublishErr(err)
		if ok, held := l.failLog.allow(now); ok {
			s.log.Warn("publish failed; slots stay pending", "err", err, "pending", len(l.pending), "failures_not_logged", held)
		}
		return err
	}
	s.setPublishErr(nil)
	if l.backoff != nil {
		l.backoff.Reset()
	}
	return nil
}

// keepTemplate is the longest gap to an entry's next slot for which its
// compiled message template is kept between fires: an entry that fires
// every few seconds reuses it, one that fires every minute or less often
// compiles it again (a few µs) rather than hold ~1.7 KB until then. At a
// million tenants' entries (~300 fires/s) the compiles cost ~1 ms a
// second; the 120,000 of them firing every 1–5 min held 200 MB of
// templates at 5 min.
const keepTemplate = 30 * time.Second

// dropTemplate forgets p's entry's template once published, unless its
// next slot is near.
func (l *loop) dropTemplate(p pendingFire) {
	if p.e.task == nil {
		return
	}
	if it := p.e.it; it == nil || it.e != p.e || it.slot.Sub(p.slot) > keepTemplate {
		p.e.task = nil
	}
}

// Templates of the slots due within prepareAhead are compiled while the
// loop is idle, prepareBatch at a time (~6 ms), prepareAgain apart when
// more are left. At a million entries most fires have no template
// (keepTemplate), and a crontab's minute makes thousands due at once: a
// compile each (~11 µs) was most of that burst's time, and its p99 lag.
const (
	prepareAhead = time.Second
	prepareBatch = 512
	prepareAgain = time.Millisecond
	// prepareEvery is how often the walk runs when it left nothing: it
	// visits every slot due within prepareAhead, and an idle loop wakes
	// for each due slot.
	prepareEvery = 100 * time.Millisecond
)

// prepare compiles the templates of the slots due by now+prepareAhead,
// up to prepareBatch of them; more says some are left. It walks only
// the heap's top: a node due later than that has no child due sooner.
func (l *loop) prepare(now time.Time) (more bool) {
	if !l.prepMore && now.Sub(l.preparedAt) < prepareEvery && !now.Before(l.preparedAt) {
		return false
	}
	l.preparedAt = now
	l.prepMore = l.prepareUpTo(now.Add(prepareAhead))
	return l.prepMore
}

func (l *loop) prepareUpTo(horizon time.Time) (more bool) {
	h := dueNs(horizon)
	if len(l.heap) == 0 || l.heap[0].due > h {
		return false
	}
	stack := append(l.prepStack[:0], 0)
	n := 0
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		it := l.heap[i]
		if it.due > h {
			continue
		}
		if it.e.task == nil {
			if n == prepareBatch {
				l.prepStack = stack[:0]
				return true
			}
			l.compiled(it.e)
			n++
		}
		for c := 2*i + 1; c <= 2*i+2 && c < len(l.heap); c++ {
			stack = append(stack, c)
		}
	}
	l.prepStack = stack[:0]
	return false
}

// compiled returns e's message template, compiling it on first use.
// Reload validated the entry, so compiling cannot fail.
func (l *loop) compiled(e *entry) *celery.Task {
	if e.task == nil {
		t, err := celery.Compile(e.Entry.Spec(), l.s.cfg.Cluster, l.s.cfg.Origin, l.s.cfg.KombuPrefix)
		if err != nil {
			panic("scheduler: validated entry failed to compile: " + err.Error())
		}
		e.task = t
	}
	return e.task
}

func (e *entry) countFire(m *Metrics, r broker.Result, manual, backfill bool, now time.Time, err error) {
	i, label := int(r), r.String()
	switch {
	case manual && r == broker.ResultOK:
		i, label = len(e.fires)-2, ResultManual
	case backfill && r == broker.ResultOK:
		i, label = len(e.fires)-1, ResultBackfill
	}
	if e.fires == nil {
		e.fires = new([6]*Counter)
	}
	if e.fires[i] == nil {
		e.fires[i] = m.Fires.WithLabelValues(e.Name, label)
	}
	e.fires[i].Inc()
	m.published(e.Name, label, manual, now, err)
}

func (l *loop) state(name string) *store.EntryState {
	st := l.states[name]
	if st == nil {
		st = &store.EntryState{Name: name}
		l.states[name] = st
	}
	return st
}

// applyReload swaps in the latest config without firing spuriously.
func (l *loop) applyReload(now time.Time) {
	set, names, full := l.s.takeDelta()
	if set == l.set {
		return
	}
	if !full {
		l.applyDelta(set, names, now)
		return
	}
	old := l.set
	l.set = set
	defer l.s.applied.Store(set)
	l.heap = l.heap[:0]
	j := 0 // both sets are in name order: walk them together
	for _, e := range set.list {
		for j < len(old.list) && old.list[j].Name < e.Name {
			old.list[j].it = nil
			j++
		}
		var prev *entry
		if j < len(old.list) && old.list[j].Name == e.Name {
			prev = old.list[j]
			j++
		}
		if prev != nil && prev.it != nil && prev.Fingerprint == e.Fingerprint {
			// The same entry, on the grid startEntry anchored.
			it := prev.it
			e.sched, prev.it = prev.sched, nil
			it.e, e.it = e, it
			l.heap = append(l.heap, it)
			continue
		}
		if prev != nil {
			prev.it = nil
		}
		e.it = nil
		l.startEntry(e, l.states[e.Name], now, false)
	}
	for ; j < len(old.list); j++ {
		old.list[j].it = nil
	}
	for i, it := range l.heap {
		it.index = i
	}
	heap.Init(&l.heap)
	// Removed entries keep their state (and broker keys) for
	// RemovedGrace, in case they come back; the sweep drops them after.
	var marked []store.EntryState
	configured := set.names()
	for name, st := range l.states {
		_, has := configured[name]
		if changed, _ := st.Reconcile(has, now, l.s.cfg.RemovedGrace); changed {
			marked = append(marked, *st)
		}
	}
	if len(marked) > 0 {
		l.persist.save(marked...)
	}
	// Pending fires of removed entries are dropped, and counted.
	kept := l.pending[:0]
	for _, p := range l.pending {
		if e := set.get(p.e.Name); e != nil {
			p.e = e
			kept = append(kept, p)
		} else {
			l.s.cfg.Metrics.Missed.WithLabelValues(p.e.Name, ReasonRemoved).Inc()
		}
	}
	l.pending = kept
	l.purgeFlags()
	l.flushBaseline()
	l.s.log.Info("config applied", "entries", len(set.list))
}

// applyDelta is applyReload for a set that differs from the loop's in
// the entries named only: those are rescheduled (or dropped), the rest of
// the heap is left as it is.
func (l *loop) applyDelta(set *entrySet, names map[string]struct{}, now time.Time) {
	old := l.set
	l.set = set
	defer l.s.applied.Store(set)
	var marked []store.EntryState
	for name := range names {
		prev, e := old.get(name), set.get(name)
		had, has := prev != nil, e != nil
		if had && has && prev == e {
			continue // named by an earlier change the loop already has
		}
		var it *item
		if had {
			it, prev.it = prev.it, nil
		}
		if had && has && it != nil && prev.Fingerprint == e.Fingerprint {
			e.sched, e.task, e.fires, e.runs = prev.sched, prev.task, prev.fires, prev.runs
			it.e, e.it = e, it
			continue
		}
		if it != nil {
			heap.Remove(&l.heap, it.index)
			l.s.cfg.Metrics.scheduled(name, time.Time{})
		}
		if has {
			e.it = nil
			l.startEntry(e, l.states[name], now, false)
			if e.it != nil {
				heap.Fix(&l.heap, e.it.index)
			}
		}
		if st := l.states[name]; st != nil {
			if changed, _ := st.Reconcile(has, now, l.s.cfg.RemovedGrace); changed {
				marked = append(marked, *st)
			}
		}
	}
	if len(marked) > 0 {
		l.persist.save(marked...)
	}
	kept := l.pending[:0]
	for _, p := range l.pending {
		if _, named := names[p.e.Name]; !named {
			kept = append(kept, p)
		} else if e := set.get(p.e.Name); e != nil {
			p.e = e
			kept = append(kept, p)
		} else {
			l.s.cfg.Metrics.Missed.WithLabelValues(p.e.Name, ReasonRemoved).Inc()
		}
	}
	l.pending = kept
	l.purgeFlags()
	l.flushBaseline()
	l.s.log.Info("config applied", "entries", len(set.list), "changed", len(names))
}

// sweepRemoved drops the state and broker keys of entries removed longer
// than RemovedGrace ago, as a new term's start does.
func (l *loop) sweepRemoved(ctx context.Context, now time.Time) error {
	l.nextSweep = nextSweepAt(now)
	var (
		gone    []string
		changed []store.EntryState
	)
	configured := l.set.names()
	for name, st := range l.states {
		_, has := configured[name]
		switch c, g := st.Reconcile(has, now, l.s.cfg.RemovedGrace); {
		case g:
			gone = append(gone, name)
			delete(l.states, name)
		case c:
			changed = append(changed, *st)
		}
	}
	if len(changed) > 0 {
		l.persist.save(changed...)
	}
	if len(gone) == 0 {
		return nil
	}
	l.persist.remove(gone...)
	return l.forget(ctx, gone)
}

// forget drops what the broker keeps of entries gone for good. Their etcd
// state is gone (or going) with them, so if one comes back it starts
// afresh, from now: no slot it had before can be owed again. A failure is
// logged and left: the keys are small, and the next term or sweep sees
// only entries whose state still exists.
func (l *loop) forget(ctx context.Context, names []string) error {
	f, ok := l.s.cfg.Dispatcher.(Forgetter)
	if !ok || len(names) == 0 {
		return nil
	}
	err := f.Forget(ctx, l.term.Token, names)
	switch {
	case errors.Is(err, broker.ErrStale):
		return fmt.Errorf("%w: forget removed entries: %w", ErrTermEnded, err)
	case err != nil:
		l.s.log.Warn("broker keys of removed entries not dropped", "entries", len(names), "err", err)
	default:
		l.s.log.Info("removed entries forgotten", "entries", len(names))
	}
	return nil
}

// flushBaseline hands the Since baselines set by startEntry to the
// persister.
func (l *loop) flushBaseline() {
	if len(l.baseline) > 0 {
		l.persist.saveNow(l.baseline...)
		l.baseline = nil
	}
}

// handleRequests applies admin requests. A trigger becomes a pending manual
// fire, completed once published; pause and resume complete at once, in
// order with state writes.
func (l *loop) handleRequests(ctx context.Context, reqs []store.Request) {
	now := l.s.cfg.Clock.Now()
	for _, r := range reqs {
		if l.persist.seen(r.ID) {
			continue
		}
		switch r.Op {
		case store.OpBackfill:
			l.persist.markSeen(r.ID)
			if !l.startBackfill(ctx, r, now) {
				l.bfRetry = append(l.bfRetry, r)
			}
			continue
		case store.OpCancelBackfill:
			l.persist.markSeen(r.ID)
			l.cancelBackfill(ctx, r, reqs, now)
			continue
		}
		e := l.set.get(r.Entry)
		if e == nil {
			l.s.log.Warn("admin request for an unknown entry", "op", r.Op, "entry", r.Entry)
			l.persist.complete(r, nil)
			continue
		}
		st := l.state(e.Name)
		switch r.Op {
		case store.OpTrigger:
			req := r
			now := l.s.cfg.Clock.Now()
			l.pending = append(l.pending, pendingFire{e: e, slot: now, due: now, manual: true, req: &req})
			l.persist.markSeen(r.ID)
		case store.OpPause:
			st.Paused = true
			if r.Actor != "" || r.Note != "" {
				// Status shows who paused it and why, until a resume.
				if st.Out == nil {
					st.Out = &store.Outcomes{}
				}
				st.Out.PauseReason = manualPauseReason(r)
			}
			l.persist.complete(r, st)
			l.s.log.Info("paused", "entry", e.Name)
		case store.OpResume:
			// Slots of the pause are not owed, even to a later leader.
			st.Paused = false
			if st.Out != nil {
				// A resume starts the failure count afresh: the next
				// failure must not pause again at once.
				st.Out.PauseReason, st.Out.Failures = "", 0
			}
			st.Since = l.s.cfg.Clock.Now()
			if ev, ok := schedule.Base(e.sched).(*schedule.Every); ok {
				st.Since = ev.Prev(st.Since) // owes the same slots, keeps the grid Since anchors
			}
			l.persist.complete(r, st)
			l.s.log.Info("resumed", "entry", e.Name)
		default:
			l.persist.complete(r, nil)
		}
	}
}

// manualPauseReason is what status says of a manual pause: who, when, why.
func manualPauseReason(r store.Request) string {
	why := "paused"
	if r.Actor != "" {
		why += " by " + r.Actor
	}
	why += " at " + r.RequestedAt.UTC().Format(time.RFC3339)
	if r.Note != "" {
		why += ": " + r.Note
	}
	return why
}

// finishBudget bounds the final state write on shutdown. Persisting is an
// optimisation here (the next leader's re-publish of an unrecorded slot
// dedups), so it must not delay the handover when etcd is slow.
const finishBudget = 500 * time.Millisecond

// finish persists everything published before the loop stops, within
// finishBudget.
func (l *loop) finish() error {
	l.fireLog.summarise(l.s.log, l.s.cfg.Clock.Now().Add(time.Second), l.term.Token)
	ctx, cancel := context.WithTimeout(context.Background(), finishBudget)
	defer cancel()
	if err := l.persist.flush(ctx, false); err != nil {
		l.s.log.Warn("state not fully persisted before stopping; the next leader re-publishes (deduplicated)", "err", err)
	}
	return nil
}
