package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// Dispatcher publishes fires, fenced by the leader's token.
type Dispatcher interface {
	RaiseFence(ctx context.Context, token int64) error
	Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error
}

// TermCloser is a Dispatcher that records a term's clean end, once every
// slot the term published is in its state table (RabbitMQ: a journal
// record that a resize checks for, since the journal is the shard's and
// would not follow the entries that move).
type TermCloser interface {
	CloseTerm(ctx context.Context, token int64) error
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
// write. Not an outcome.History: it reads only each entry's newest record.
type LastPublisher interface {
	LastPublished(ctx context.Context, entries []string) (map[string]outcome.Run, error)
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
	// Scheduling, when set, is called once the term has started (its
	// state read, the fence raised, every entry scheduled), before its
	// first publish; not at all when Run returns before that.
	Scheduling func()
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
	// FirstSeen, if set, is when this replica first saw an entry that
	// carries no time it was defined (a file's, a django-celery-beat
	// row's), if its source gained it while the replica ran; zero when
	// unknown. A leader that finds no baseline for such an entry owes its
	// slots from then (owedSince).
	FirstSeen func(name string) time.Time
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

// DefaultBatchSize is Config.BatchSize unless set.
const DefaultBatchSize = 2048

// ErrTermEnded is returned by Run when the loop stopped because leadership
// ended (a stale fence or a refused write), not because of its context.
var ErrTermEnded = errors.New("scheduler: term ended")

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
