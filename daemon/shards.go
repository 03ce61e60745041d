package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/broker"
	amqpbroker "github.com/beatd/beatd/broker/amqp"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/etcdscan"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/leader"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrShardCount means a replica's --shards is not its cluster's.
var ErrShardCount = errors.New("shards: the shard count differs from the cluster's")

// checkShardCount makes n the cluster's shard count, or refuses it. A
// cluster's count is fixed when it is made: a sharded one records it in
// keys.ShardCount; a cluster without that key has one shard (every cluster
// from before sharding, and every one run with --shards 1, which so writes
// nothing new). A count is recorded only on a prefix that holds no
// cluster yet, in one transaction that checks so: an unsharded cluster's
// election, state or registrations refuse it.
func checkShardCount(ctx context.Context, cli *clientv3.Client, prefix string, n int) error {
	if err := reshard.CheckNotResizing(ctx, cli, prefix); err != nil {
		return err
	}
	key := keys.ShardCount(prefix)
	for {
		have, recorded, err := reshard.ReadCount(ctx, cli, prefix)
		if err != nil {
			return err
		}
		if recorded {
			if have != n {
				return fmt.Errorf("%w: --shards %d, but the cluster at %s was made with %d shards; start every replica with --shards %d", ErrShardCount, n, prefix, have, have)
			}
			return nil
		}
		if n == 1 {
			return nil
		}
		empty := func(p string) clientv3.Cmp {
			return clientv3.Compare(clientv3.CreateRevision(p), "=", 0).WithPrefix()
		}
		txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
			empty(keys.Leaders(prefix)), empty(keys.State(prefix)), empty(keys.Replicas(prefix)), empty(keys.LegacyEntries(prefix))).
			Then(clientv3.OpPut(key, strconv.Itoa(n))).Commit()
		if err != nil {
			return fmt.Errorf("shards: record the shard count (%s): %w", key, err)
		}
		if txn.Succeeded {
			return nil
		}
		if again, err := cli.Get(ctx, key, clientv3.WithCountOnly()); err == nil && again.Count == 1 {
			continue // another replica recorded one first: compare with it
		}
		return fmt.Errorf("%w: --shards %d, but the cluster at %s was made with 1 shard (it has an election, state or replicas and no %s); start every replica with --shards 1",
			ErrShardCount, n, prefix, key)
	}
}

// shardBalanceEvery is how often a sharded replica reads how many
// replicas live and hands over a shard above its share; a move costs up
// to this much on top of the new leader's start.
const shardBalanceEvery = 250 * time.Millisecond

// shardSet is a sharded replica's leadership: a leader.Loop per shard,
// each with its own election, fencing token, state table, broker fence
// and scheduler over only that shard's entries (keys.ShardOf). A shard's
// entries, of every source, are loaded before the replica campaigns for
// it (prepare, shardDeps.defs) and dropped when its term or campaign
// ends, so a replica holds the entries of the shards it leads and of the
// few it is about to lead, never more than its most share.
//
// Balance is kept by each replica alone, from the number of live replicas
// (the registry, keys.Replicas) and one range read of every shard's
// election (readView), both every shardBalanceEvery: its share is between
// lo = floor(shards / live) and hi = ceil(shards / live). A replica
// below hi campaigns for a shard nobody leads, and for the surplus of a
// replica above its share (wants); otherwise it withdraws its campaign
// (gatedElector), so it never queues for a shard it is not owed. A
// replica above lo hands over one shard each shardBalanceEvery, and only
// a shard whose election has another candidate waiting, which has loaded
// the shard's entries already: the handover ends the term as a SIGTERM
// does (the loop persists, then resigns) and the waiting candidate wins
// at once and reads only the shard's state. A dead replica's shards are won by the others once its leases
// expire (its registration expires with the same TTL, which raises their
// share).
type shardSet struct {
	id     string // this replica's, the value of its candidate keys
	n      int
	prefix string
	cli    *clientv3.Client
	clock  clockwork.Clock
	log    *slog.Logger
	shards []*shard
	// live is the number of registered replicas, as last read (0: not
	// read yet, which counts as this replica alone).
	live atomic.Int64
	// ids are the live replicas' ids, sorted, as last read (coldWants).
	ids atomic.Pointer[[]string]
	// registered says whether the last read found this replica's own
	// registration (a cold start ranks only once it has).
	registered atomic.Bool
	// began is when Run started (coldWants).
	began time.Time
	// stopping is Run's ctx's Done (settle).
	stopping <-chan struct{}
	// view is every shard's election as last read (nil: not read yet).
	view atomic.Pointer[shardView]
	led  prometheus.Gauge
	wg   sync.WaitGroup
	hold func() time.Duration // shardDeps.hold
	// defs is shardDeps.defs: a shard's entries, loaded by prepare before
	// the replica campaigns for it.
	defs    func(ctx context.Context, i int) (stop func(), err error)
	release func() // shardDeps.release
	// lift is shardDeps.lift (nil: none).
	lift func() (restore func())
	// starts counts this replica's shards that are loaded for a term or
	// whose term is starting (from the end of their load to their term's
	// scheduling): a shard's load does not begin while one is, so a
	// move's start has the process to itself (startGate).
	starts startGate
	// prepMu makes prepare's check of the share and its reservation one
	// step across the shards' campaigns.
	prepMu sync.Mutex
	// loading holds the one shard load under way (prepare).
	loading chan struct{}
	// ahead says whether the load under way is of a shard another
	// replica leads (load; background). A term won without its entries
	// loads them itself, at once, as one nobody leads.
	ahead atomic.Bool
	// draining is set once the replica hands its shards over to exit
	// (drain); a value on poke makes its registration say so at once.
	draining atomic.Bool
	poke     chan struct{}
	// loads are, by shard, the other live replicas that load it or have
	// loaded it (their registrations' Loading), as last read.
	loads atomic.Pointer[[][]string]
	// busy counts this replica's work that slows a move's start on a
	// shared host (work): its registration says so (Replica.Busy).
	busy atomic.Int32
	// others is what the other replicas' registrations said, as last
	// read (readLive).
	others atomic.Pointer[otherReplicas]
	// moves spaces this replica's handovers and bounds how long one waits
	// for a quiet cluster (quiet).
	moves struct {
		mu        sync.Mutex
		last      time.Time // this replica's last handover
		heldSince time.Time // since when the next one waits (zero: none does)
	}
}

// otherReplicas is what the other live replicas' registrations say.
type otherReplicas struct {
	busy    bool // one is busy (Replica.Busy)
	waiting bool // one holds a shard loaded for its move (Replica.Waiting)
	// registered are every registered replica's id, draining ones too.
	registered map[string]bool
}

// shard is one shard's leadership on this replica.
type shard struct {
	i      int
	prefix string // keys.Shard: its election and state table
	sched  *scheduler.Scheduler
	pub    *redisbroker.Publisher // its dispatcher on Redis, else nil
	// metrics are its scheduler's, whose entry results /status overlays.
	metrics *scheduler.Metrics
	loop    *leader.Loop
	el      *election.Elector
	// state reads its state table ahead of a term (prepare), when its
	// store can.
	state stateWarmer

	mu sync.Mutex
	// handover ends the current term gracefully (nil when not leading).
	handover context.CancelFunc
	// resign ends the current term's lease at once (the term's Resign).
	resign func(context.Context) error
	token  int64
	// handedAt is when this replica last handed the shard over: it does
	// not campaign for it again for shardHandoverQuiet, so the shard goes
	// to the replica that waited, not back to this one.
	handedAt time.Time
	// preparing is set while the shard's entries load ahead of a term,
	// and prepared is their stop once loaded, until a term takes them or
	// the campaign ends (shardSet.prepare).
	preparing bool
	prepared  func()
	// waiting ends the prepared entries' count in the replica's
	// startGate (shardSet.starts), from their load to their term's
	// scheduling or their drop.
	waiting func()
	// loadingNow is set while prepare reads the entries (it holds the
	// replica's one load), not while it waits for its turn.
	loadingNow bool
	// handing is set once this term is handed over (handOverOne), which
	// it then is not again while it ends.
	handing bool
}

// stateWarmer is a shard's state table that can be read ahead of a term
// (store.Store.Warm), so the term reads only what changed since.
type stateWarmer interface {
	Warm(ctx context.Context) error
	Cool()
}

// shardResignTimeout bounds a shard term's resign (leader's own bound).
const shardResignTimeout = 2 * time.Second

// handoverSettle is how long a replica that handed a shard over to
// balance the cluster keeps the shard's entries before dropping them.
// The drop rebuilds the replica's merged config (~0.4 s of CPU at 56,000
// entries), and it ran while the shard's new leader started: on a shared
// host that start is the move's delay. A draining replica drops at once,
// on its way out.
const handoverSettle = 1500 * time.Millisecond

// settle waits handoverSettle, or until the shard set stops (Run's ctx:
// a term's own ends with its resign).
func (s *shardSet) settle() {
	t := s.clock.NewTimer(handoverSettle)
	defer t.Stop()
	select {
	case <-t.Chan():
	case <-s.stopping:
	}
}

// minShardFeedBuffer is the least outcome buffer a shard's loop gets
// (feedBuffer is split among the shards).
const minShardFeedBuffer = 1024

// shardHandoverQuiet is how long a replica stays out of a shard's
// election after handing it over, unless it falls below its least share.
const shardHandoverQuiet = 2 * time.Second

// A cold start is a replica's first shardColdStart while no other
// replica leads a shard: the whole cluster starting together (at its
// creation, after a resize, after a full stop). Each replica's first
// reads then see only the replicas registered so far, so the first one up
// would count itself alone and win every shard, loading every shard's
// runtime entries, and hand most of them over a moment later: its peak
// memory would be the whole cluster's. So for shardColdSettle it
// campaigns for nothing (the replicas started with it register), and
// until shardColdStart it campaigns only for the shards whose number
// modulo the live replicas is its rank among their sorted ids; each
// replica then wins its own share, at once. Past shardColdStart, or as
// soon as another replica leads a shard, the usual rules hold (a replica
// started late is handed its share).
const (
	shardColdSettle = 3 * shardBalanceEvery
	shardColdStart  = 2 * time.Second
)

// shardDeps is what each shard's scheduler is built with: the replica's
// scheduler config, less what one shard must have of its own.
type shardDeps struct {
	sched    scheduler.Config
	dispatch func(i int) (scheduler.Dispatcher, error)
	store    func(i int) scheduler.StateStore
	leaseTTL time.Duration
	id       string
	// perEntryLimit is --metrics-per-entry-limit (0: the default).
	perEntryLimit int
	// lead, when set, runs beside shard 0's scheduler for its term (the
	// catalog, which is the cluster's, is published by shard 0's leader).
	lead0 func(leader.Term) (stop func())
	// hold, when set, is how long this replica stays out of every shard's
	// election (a replica that handed its shards over for a cut path to
	// the broker: Main.electionHold).
	hold func() time.Duration
	// observe, when set, is shard i's scheduler's Observer (the console's
	// timeline of that shard's fires), in place of sched's.
	observe func(i int) func(entry string, slot time.Time, r broker.Result, lag time.Duration, manual bool)
	// defs, when set, loads shard i's entries for a term of it,
	// before its scheduler runs, and stop drops them when the term ends
	// (shardDefs).
	defs func(ctx context.Context, i int) (stop func(), err error)
	// release, when set, returns free memory to the OS after each load
	// (Main.release).
	release func()
	// lift, when set, raises the GC's growth while a term starts and no
	// shard loads, until the restore it returns (Main.lift, liftGC).
	lift func() (restore func())
}

func newShardSet(cli *clientv3.Client, prefix string, n int, cfg *config.Config, d shardDeps, reg prometheus.Registerer, log *slog.Logger) (*shardSet, error) {
	s := &shardSet{id: d.id, n: n, prefix: prefix, cli: cli, clock: d.sched.Clock, log: log.With("component", "shards"), hold: d.hold, defs: d.defs, release: d.release, lift: d.lift,
		poke: make(chan struct{}, 1), loading: make(chan struct{}, 1),
		led: prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_shards_led", Help: "Shards this replica leads now."})}
	if s.clock == nil {
		s.clock = clockwork.NewRealClock()
	}
	if reg != nil {
		if err := reg.Register(s.led); err != nil {
			return nil, fmt.Errorf("shards: register metrics: %w", err)
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "beatd_shards", Help: "The cluster's shard count."},
			func() float64 { return float64(n) }))
	}
	parts := s.split(cfg)
	for i := range n {
		sh := &shard{i: i, prefix: keys.Shard(prefix, i, n)}
		sc := d.sched
		dispatcher, err := d.dispatch(i)
		if err != nil {
			return nil, fmt.Errorf("shards: shard %d: %w", i, err)
		}
		sc.Dispatcher, sc.Store, sc.Logger = dispatcher, d.store(i), log.With("shard", i)
		sh.state, _ = sc.Store.(stateWarmer)
		if d.observe != nil {
			sc.Observer = d.observe(i)
		}
		sh.pub, _ = dispatcher.(*redisbroker.Publisher)
		// Each shard's loop owns its scheduler's metrics (its gauges are
		// the loop's: pending slots, the state backlog, the entries' next
		// fires), so each shard exports its own, labelled shard="i"; the
		// replica's own, of no loop, are shard="" (newMetrics).
		shardReg := prometheus.Registerer(prometheus.NewRegistry())
		if reg != nil {
			shardReg = prometheus.WrapRegistererWith(prometheus.Labels{"shard": strconv.Itoa(i)}, reg)
		}
		sc.Metrics = scheduler.NewMetrics(shardReg)
		sh.metrics = sc.Metrics
		// --metrics-per-entry-limit is the replica's, over its shards.
		if d.perEntryLimit > 0 {
			sc.Metrics.PerEntryLimit = (d.perEntryLimit + n - 1) / n
		}
		// The replica's one set of outcome consumers feeds every shard's
		// loop: each reads a Sub, which gets the reports about the runs
		// that loop watches (its own entries').
		var sub *outcome.Feed
		if d.sched.Outcomes != nil {
			sub = d.sched.Outcomes.Sub(max(feedBuffer/n, minShardFeedBuffer))
		}
		sc.Outcomes = sub
		if sh.sched, err = scheduler.New(sc, parts[i]); err != nil {
			return nil, fmt.Errorf("shards: shard %d: %w", i, err)
		}
		if sh.el, err = election.New(election.Config{Client: cli, Prefix: sh.prefix, ID: d.id, TTL: d.leaseTTL, Logger: log.With("shard", i), Clock: s.clock}); err != nil {
			return nil, err
		}
		lead := func(ctx context.Context, t leader.Term) error {
			// The shard's entries were loaded before the campaign
			// (prepare); a term won without them would load them here,
			// before it shows as led (leading, /status, /readyz).
			stop, waited := sh.takePrepared()
			defer waited() // at the latest: once the term counts as starting
			if stop == nil && d.defs != nil {
				done := s.work()
				var err error
				stop, err = d.defs(ctx, i)
				done()
				if err != nil {
					return err
				}
			}
			balanced := false // the term ended by a balancing handover
			if stop != nil {
				defer func() {
					if balanced {
						s.settle()
					}
					defer s.work()()
					stop()
				}()
			}
			ctx, handover := context.WithCancel(ctx)
			defer handover()
			sh.mu.Lock()
			sh.handover, sh.token, sh.resign = handover, t.Token, t.Resign
			sh.mu.Unlock()
			s.led.Set(float64(s.held()))
			defer func() {
				sh.mu.Lock()
				sh.handover, sh.token, sh.resign, sh.handing = nil, 0, nil, false
				sh.mu.Unlock()
				s.led.Set(float64(s.held()))
			}()
			if i == 0 && d.lead0 != nil {
				defer d.lead0(t)()
			}
			if sub != nil {
				// Once the term ends nobody reads the sub: its runs'
				// reports go back to the held ones, for whoever leads next.
				defer sub.Clear()
			}
			term := t.Term
			term.Scheduling = s.termStarting()
			waited()
			err := sh.sched.Run(ctx, term)
			term.Scheduling() // a start that failed ends too
			sh.mu.Lock()
			balanced = sh.handing && !s.draining.Load()
			sh.mu.Unlock()
			// The term is over once its scheduler has persisted: resign
			// now, so the candidate waiting wins at once, not after this
			// replica drops the shard's entries (a rebuild of its merger,
			// O(the entries it holds)) and the rest of the cleanup. The
			// loop's own resign after this is a no-op.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shardResignTimeout)
			if rerr := t.Resign(rctx); rerr != nil {
				s.log.Warn("resigning the shard failed; its lease expires", "shard", i, "err", rerr)
			}
			cancel()
			return err
		}
		if sh.loop, err = leader.New(leader.Config{Clock: s.clock, Elector: gatedElector{s: s, sh: sh, inner: leader.Etcd(sh.el)}, Lead: lead,
			Logger: log.With("shard", i)}); err != nil {
			return nil, err
		}
		s.shards = append(s.shards, sh)
	}
	return s, nil
}

// split is cfg's entries by shard, each part a config of its own.
func (s *shardSet) split(cfg *config.Config) []*config.Config {
	// Each shard's list sized first: a reload at each shard load splits
	// every held entry, and growing the lists by append was the garbage
	// of copying them twice over.
	of := make([]uint16, len(cfg.Entries))
	counts := make([]int, s.n)
	for j, e := range cfg.Entries {
		of[j] = uint16(keys.ShardOf(e.Name, s.n))
		counts[of[j]]++
	}
	lists := make([][]*config.Entry, s.n)
	for i, c := range counts {
		if c > 0 {
			lists[i] = make([]*config.Entry, 0, c)
		}
	}
	for j, e := range cfg.Entries {
		lists[of[j]] = append(lists[of[j]], e)
	}
	parts := make([]*config.Config, s.n)
	for i := range parts {
		parts[i] = cfg.WithEntries(lists[i])
	}
	return parts
}

// Reload gives each shard's scheduler its part of cfg. A shard whose
// scheduler holds the very entries of its part already, under the same
// settings, is left as it is: loading one shard's runtime entries merges
// the whole config, and would otherwise rebuild every shard's schedule.
func (s *shardSet) Reload(cfg *config.Config) error {
	var errs []error
	for i, part := range s.split(cfg) {
		if cur := s.shards[i].sched.Config(); cur.SameSettings(part) && slices.Equal(cur.Entries, part.Entries) {
			continue
		}
		if err := s.shards[i].sched.Reload(part); err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// ReloadDelta gives the shards that hold a changed entry their part of
// cfg, and the names changed in it; the other shards are unchanged. cfg
// is split once, whatever the number of shards changed.
func (s *shardSet) ReloadDelta(cfg *config.Config, changed []string) error {
	byShard := make([][]string, s.n)
	for _, name := range changed {
		i := keys.ShardOf(name, s.n)
		byShard[i] = append(byShard[i], name)
	}
	parts := s.split(cfg)
	var errs []error
	for i, names := range byShard {
		if len(names) == 0 {
			continue
		}
		if err := s.shards[i].sched.ReloadDelta(parts[i], names); err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Run runs every shard's loop and the balance until ctx ends; then each
// term in progress finishes, persists and resigns, and Run returns.
func (s *shardSet) Run(ctx context.Context) {
	s.began = s.clock.Now()
	s.stopping = ctx.Done()
	for _, sh := range s.shards {
		s.wg.Go(func() { sh.loop.Run(ctx) })
	}
	s.wg.Go(func() { s.balance(ctx) })
	s.wg.Wait()
}

// held is how many shards this replica leads.
func (s *shardSet) held() int {
	n := 0
	for _, sh := range s.shards {
		sh.mu.Lock()
		if sh.handover != nil {
			n++
		}
		sh.mu.Unlock()
	}
	return n
}

// share is how many shards this replica should lead: at least lo, at
// most hi (floor and ceiling of shards over live replicas).
func (s *shardSet) share() (lo, hi int) {
	live := max(int(s.live.Load()), 1)
	return s.n / live, (s.n + live - 1) / live
}

// wants says whether this replica should campaign for sh: never at its
// most share (hi); else for a shard nobody leads, and for one another
// replica leads only while that replica leads more than it keeps (lo
// while this replica is below lo: it hands one over to a replica owed
// one; else hi) and this replica claims fewer of its shards than that
// surplus. A campaign comes after the shard's entries are loaded
// (prepare), so claiming only what will be handed over keeps what a
// replica loads to its share; and it never queues for a shard it is not
// owed.
func (s *shardSet) wants(sh *shard) bool {
	if s.hold != nil && s.hold() > 0 {
		return false // handed over for a cut path to the broker
	}
	if s.draining.Load() {
		return false
	}
	if s.ids.Load() == nil {
		return false // its share unknown: the live replicas not read yet
	}
	if cold, want := s.coldWants(sh); cold {
		return want
	}
	held := s.held()
	lo, hi := s.share()
	if held >= hi {
		return false
	}
	keeps := lo
	if held >= lo {
		sh.mu.Lock()
		quiet := !sh.handedAt.IsZero() && s.clock.Since(sh.handedAt) < shardHandoverQuiet
		sh.mu.Unlock()
		if quiet {
			return false
		}
		keeps = hi
	}
	v := s.view.Load()
	if v == nil {
		return true
	}
	leader := v.leaders[sh.i]
	switch {
	case leader == s.id:
		return true
	case s.loadedElsewhere(sh):
		return false
	case leader == "":
		// One it has loaded it keeps: a shard handed to it shows unled
		// between the release and its win.
		return sh.isPrepared() || s.first(v, sh.i)
	}
	if ids := s.ids.Load(); ids != nil && !slices.Contains(*ids, leader) {
		// A leader out of the live replicas (draining, or dead with its
		// leases not yet expired) keeps nothing: every shard of it is
		// surplus, loaded ahead and won at its release.
		keeps = 0
	}
	return v.held[leader]-keeps > s.claimed(v, leader, sh.i)
}

// shardFreeWait is how long a free shard waits for the replica it falls
// to (first) before any replica owed one campaigns for it.
const shardFreeWait = time.Second

// first says whether this replica campaigns at once for shard i, which
// nobody leads. A shard a live replica let go (a handover whose waiter
// withdrew, a SIGTERM) is anyone's at once. One whose leader is gone (its
// lease expired) is first the replica's whose rank among the live
// replicas' sorted ids is i modulo their number, and the others' after
// shardFreeWait: a dead replica's shards are so split among the others
// without each loading every one of them (a campaign comes after the
// load) and the loser dropping it.
func (s *shardSet) first(v *shardView, i int) bool {
	ids := s.ids.Load()
	// No live replica read (every registration lapsed, its own too): no
	// rank to go by.
	if ids == nil || len(*ids) == 0 || v.freeSince == nil || s.clock.Since(v.freeSince[i]) >= shardFreeWait {
		return true
	}
	if l := v.lastLeader[i]; l != "" && slices.Contains(*ids, l) {
		return true
	}
	return i%len(*ids) == slices.Index(*ids, s.id)
}

// claimed is how many shards below shard i that leader leads, as v
// says, this replica prepares or campaigns for: a shard claimed by the
// lower numbers first, so a surplus is claimed once.
func (s *shardSet) claimed(v *shardView, leader string, i int) int {
	n := 0
	for _, o := range s.shards[:i] {
		if v.leaders[o.i] != leader {
			continue
		}
		o.mu.Lock()
		if o.preparing || o.prepared != nil {
			n++
		}
		o.mu.Unlock()
	}
	return n
}

// prepare loads sh's entries ahead of a campaign for it (shardDeps.defs),
// so the term it wins schedules once it has read its state: a move is
// then ready before the old leader resigns (it hands over only a shard
// whose election has a candidate waiting), and a shard's election to
// scheduling holds no definitions' read. It is false, loading nothing,
// while the shards this replica leads and prepares fill its most share,
// so it never holds more than that.
func (s *shardSet) prepare(ctx context.Context, sh *shard) (bool, error) {
	if s.defs == nil {
		return true, nil
	}
	s.prepMu.Lock()
	sh.mu.Lock()
	ready := sh.prepared != nil
	sh.mu.Unlock()
	if ready {
		s.prepMu.Unlock()
		return true, nil
	}
	if _, hi := s.share(); s.held()+s.pending() >= hi {
		s.prepMu.Unlock()
		return false, nil
	}
	sh.mu.Lock()
	sh.preparing = true
	sh.mu.Unlock()
	s.prepMu.Unlock()
	// The load is abandoned once the replica no longer wants the shard
	// (a share read anew, another replica's win): a load takes seconds
	// at scale, and what it holds is the share's budget. One shard loads
	// at a time, so a replica's loads do not all slow each other down
	// and its transient memory is one shard's read.
	lctx, abort := context.WithCancelCause(ctx)
	loaded, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		t := s.clock.NewTicker(shardBalanceEvery)
		defer t.Stop()
		for {
			select {
			case <-loaded:
				return
			case <-lctx.Done():
				return
			case <-t.Chan():
				if !s.wants(sh) {
					abort(errWithdrawn)
					return
				}
			}
		}
	}()
	stop, waiting, err := s.load(lctx, sh)
	if err != nil && lctx.Err() != nil {
		err = context.Cause(lctx)
	}
	close(loaded)
	<-watched
	withdrawn := errors.Is(context.Cause(lctx), errWithdrawn)
	var drop func()
	if err != nil {
		abort(nil)
	} else {
		drop = func() {
			stop()
			abort(nil)
			if sh.state != nil {
				sh.state.Cool() // a term's Load took it; a campaign lost drops it
			}
		}
	}
	sh.mu.Lock()
	sh.preparing, sh.prepared, sh.loadingNow = false, drop, false
	if drop != nil {
		sh.waiting = waiting
	}
	sh.mu.Unlock()
	s.pokeRegistration()
	if withdrawn && err != nil {
		return false, nil // no longer wanted: not a failure
	}
	return err == nil, err
}

// load reads sh's entries and its state table, as the replica's one
// load under way, and returns what drops them, and waiting, which ends
// their count in the replica's startGate.
func (s *shardSet) load(ctx context.Context, sh *shard) (stop, waiting func(), err error) {
	select {
	case s.loading <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, context.Cause(ctx)
	}
	defer func() { <-s.loading }()
	// A move's start goes first: a load's parse and its garbage would
	// slow it. Waited for once this load's turn has come, as a load
	// queued behind another would pass a check made before that one
	// ended, and load beside the term it prepared.
	if err := s.waitTurn(ctx, sh); err != nil {
		return nil, nil, err
	}
	defer s.work()()
	// A shard that another replica leads is loaded ahead of its move,
	// and its parse yields to the terms running (background). One nobody
	// leads waits for this load (after a kill -9, at a cold start): it
	// runs at the replica's priority.
	if v := s.view.Load(); v != nil && v.leaders[sh.i] != "" {
		s.ahead.Store(true)
		defer s.ahead.Store(false)
	}
	s.setLoading(sh)
	if stop, err = s.defs(ctx, sh.i); err != nil {
		return nil, nil, err
	}
	if sh.state != nil {
		// Its state too: the term then reads only what the last
		// leader wrote after this, not the whole table.
		if werr := sh.state.Warm(ctx); werr != nil && ctx.Err() == nil {
			s.log.Warn("reading a shard's state ahead of its term failed; the term reads it whole", "shard", sh.i, "err", werr)
		}
	}
	if s.release != nil {
		// Before the next load starts, so that one's garbage
		// reuses these pages rather than adding to them.
		s.release()
	}
	// Loaded, it waits for its term: the replica's next load waits too,
	// until that term schedules or the entries are dropped. Counted
	// before this load gives up its turn, so the next sees it.
	return stop, s.starts.begin(), nil
}

// termStarting counts a term of this replica as starting until the
// returned func is called (once its scheduler schedules, or its Run
// returns; further calls do nothing), and lifts the GC meanwhile when no
// shard is loading.
func (s *shardSet) termStarting() (started func()) {
	gate, working := s.starts.begin(), s.work()
	end := func() { gate(); working() }
	if s.lift == nil || len(s.loading) > 0 {
		return end
	}
	restore := s.lift()
	var once sync.Once // a lift's restore need not be once itself
	return func() { once.Do(func() { restore(); end() }) }
}

// work counts one piece of this replica's busy work (Replica.Busy) until
// the returned done (once, however often it is called), and has the
// registration say so at once, either way.
func (s *shardSet) work() (done func()) {
	s.busy.Add(1)
	s.pokeRegistration()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.busy.Add(-1)
			s.pokeRegistration()
		})
	}
}

// activity is what the replica's registration says of its work:
// Replica.Busy and Replica.Waiting.
func (s *shardSet) activity() (busy, waiting bool) {
	for _, sh := range s.shards {
		if sh.isPrepared() {
			waiting = true
			break
		}
	}
	return s.busy.Load() > 0, waiting
}

// aheadOfMove says whether sh is led by another registered replica (a
// draining one too), so that its load is ahead of a handover; not one
// whose leader is gone (a kill -9), which the cluster waits for.
func (s *shardSet) aheadOfMove(sh *shard) bool {
	v, o := s.view.Load(), s.others.Load()
	if v == nil || o == nil {
		return false
	}
	l := v.leaders[sh.i]
	return l != "" && l != s.id && o.registered[l]
}

// waitTurn waits before a load of sh: until this replica has no term
// starting and no shard loaded for one (startGate, startGateWait at
// most); and, for a load ahead of a move, until no other replica is busy
// or waits for its move (otherReplicas), handoverQuietWait at most in
// all, as long as a handover waits for a quiet cluster. A load's read
// and parse, and its etcd range reads, slowed a move's start on a shared
// host from 0.3 s to 1–2.5 s; a load ahead of a move can wait, and one of
// a shard nobody leads cannot. When a replica drains, each other replica
// loads one of its shards, and two loads side by side take 4–5 s here at
// 56,000 entries a shard: a third load that went after 5 s ran beside the
// first move's start (1.08 s).
func (s *shardSet) waitTurn(ctx context.Context, sh *shard) error {
	began := s.clock.Now()
	if err := s.starts.idle(ctx, s.clock); err != nil {
		return err
	}
	if !s.aheadOfMove(sh) {
		return nil
	}
	t := s.clock.NewTicker(shardBalanceEvery)
	defer t.Stop()
	for s.clock.Since(began) < handoverQuietWait {
		if o := s.others.Load(); o == nil || !o.busy && !o.waiting {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.Chan():
		}
	}
	return nil
}

// Handovers are made handoverSpacing apart, so that the registrations of
// the last move (its new leader starting) are read before the next, and
// each waits while a replica is busy (Replica.Busy), handoverQuietWait at
// most (a load at 56,000 entries a shard took 5–11 s here), and a drain's
// a share of its budget left: a move's start took 0.3 s on a quiet 2-core
// host and 1–2.5 s beside another replica's load or drop. The old leader
// fires meanwhile, so the wait delays no slot.
const (
	handoverSpacing   = 500 * time.Millisecond
	handoverQuietWait = 10 * time.Second
)

// quiet says whether this replica may hand a shard over now: handoverSpacing
// after its last handover, and while neither it nor another replica is
// busy or once its next handover has waited longest for that.
func (s *shardSet) quiet(longest time.Duration) bool {
	s.moves.mu.Lock()
	defer s.moves.mu.Unlock()
	now := s.clock.Now()
	if !s.moves.last.IsZero() && now.Sub(s.moves.last) < handoverSpacing {
		return false
	}
	if o := s.others.Load(); s.busy.Load() == 0 && (o == nil || !o.busy) {
		return true
	}
	if s.moves.heldSince.IsZero() {
		s.moves.heldSince = now
	}
	return now.Sub(s.moves.heldSince) >= longest
}

// moved notes a handover made now (quiet).
func (s *shardSet) moved() {
	s.moves.mu.Lock()
	s.moves.last, s.moves.heldSince = s.clock.Now(), time.Time{}
	s.moves.mu.Unlock()
}

// noMove notes that no handover waits (quiet's wait starts afresh).
func (s *shardSet) noMove() {
	s.moves.mu.Lock()
	s.moves.heldSince = time.Time{}
	s.moves.mu.Unlock()
}

// startGate counts the shards loaded for a term and the terms starting,
// and lets a load wait until none is.
type startGate struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed while n == 0 (nil: never opened, n == 0)
}

// begin counts a start until the returned end (once, however often
// it is called).
func (g *startGate) begin() (end func()) {
	g.mu.Lock()
	if g.n == 0 {
		g.none = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			if g.n--; g.n == 0 {
				close(g.none)
			}
			g.mu.Unlock()
		})
	}
}

// startGateWait bounds how long a load waits for the terms starting: a
// start that cannot finish (its broker down, its fence refused while it
// retries) must not keep the replica from loading the shards it is owed.
const startGateWait = 5 * time.Second

// idle waits until no start is counted, for startGateWait at most on
// clock, or until ctx ends.
func (g *startGate) idle(ctx context.Context, clock clockwork.Clock) error {
	g.mu.Lock()
	n, none := g.n, g.none
	g.mu.Unlock()
	if n == 0 {
		return nil
	}
	t := clock.NewTimer(startGateWait)
	defer t.Stop()
	select {
	case <-none:
	case <-t.Chan():
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// background runs fn, a part of a load that holds no lock
// (sources.Config.Background): on the replica's background thread, at a
// lower priority, when the load is ahead of a move; else at once.
func (s *shardSet) background(fn func()) {
	if !s.ahead.Load() {
		fn()
		return
	}
	inBackground(fn)
}

// setLoading marks sh's entries as being read, and says so in the
// replica's registration at once (prepare clears it with the load's
// outcome).
func (s *shardSet) setLoading(sh *shard) {
	sh.mu.Lock()
	sh.loadingNow = true
	sh.mu.Unlock()
	s.pokeRegistration()
}

// pokeRegistration has the replica's registration written at once.
func (s *shardSet) pokeRegistration() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// loadingShards are the shards whose entries this replica reads or holds
// for a campaign (its registration's Loading).
func (s *shardSet) loadingShards() []int {
	var out []int
	for _, sh := range s.shards {
		sh.mu.Lock()
		if sh.loadingNow || sh.prepared != nil {
			out = append(out, sh.i)
		}
		sh.mu.Unlock()
	}
	return out
}

// loadedElsewhere says whether this replica leaves sh, which it does not
// lead, to another live replica that loads it or has loaded it (its
// registration's Loading). A load takes seconds at scale and holds a
// shard's worth of memory, and without it every replica owed a shard
// loaded the same free one (the shards of a replica killed, or still
// loading its cold-start share) and all but one dropped it. What this
// replica has loaded it keeps; a load of its own under way gives way
// only to a replica that ranks before it for the shard (rankFor), so of
// two loads begun together one goes on.
func (s *shardSet) loadedElsewhere(sh *shard) bool {
	lp := s.loads.Load()
	if lp == nil || len((*lp)[sh.i]) == 0 {
		return false
	}
	sh.mu.Lock()
	prepared, loading := sh.prepared != nil, sh.loadingNow
	sh.mu.Unlock()
	if prepared {
		return false
	}
	if !loading {
		return true
	}
	mine := s.rankFor(s.id, sh.i)
	for _, o := range (*lp)[sh.i] {
		if r := s.rankFor(o, sh.i); r < mine || (r == mine && o < s.id) {
			return true
		}
	}
	return false
}

// rankFor is replica id's place for shard i among the live replicas:
// their sorted ids turned so that the one first holds rank 0 (first's
// replica), the next rank 1, and so on; one not among them ranks last.
func (s *shardSet) rankFor(id string, i int) int {
	ids := s.ids.Load()
	if ids == nil || len(*ids) == 0 {
		return 0
	}
	n := len(*ids)
	j := slices.Index(*ids, id)
	if j < 0 {
		return n
	}
	return ((j-i)%n + n) % n
}

// pending is how many shards this replica prepares or has prepared and
// does not lead yet.
func (s *shardSet) pending() int {
	n := 0
	for _, sh := range s.shards {
		sh.mu.Lock()
		if sh.preparing || sh.prepared != nil {
			n++
		}
		sh.mu.Unlock()
	}
	return n
}

// unprepare drops sh's entries loaded for a campaign that ended without
// a term.
func (s *shardSet) unprepare(sh *shard) {
	stop, waited := sh.takePrepared()
	if stop != nil {
		done := s.work()
		stop()
		done()
	}
	waited()
}

// isPrepared says whether the shard's entries are loaded for a campaign.
func (sh *shard) isPrepared() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.prepared != nil
}

// takePrepared hands the shard's prepared entries' stop to its term
// (nil: none loaded), and waited, which ends their count in the
// replica's startGate (a no-op when none were loaded).
func (sh *shard) takePrepared() (stop, waited func()) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	stop, waited = sh.prepared, sh.waiting
	sh.prepared, sh.waiting = nil, nil
	if waited == nil {
		waited = func() {}
	}
	return stop, waited
}

// coldWants says whether the replica is in a cold start, and then
// whether it campaigns for sh (shardColdStart).
func (s *shardSet) coldWants(sh *shard) (cold, want bool) {
	since := s.clock.Since(s.began)
	if s.began.IsZero() || since >= shardColdStart {
		return false, false
	}
	v, ids := s.view.Load(), s.ids.Load()
	if v == nil || ids == nil {
		return true, false // nothing read yet
	}
	for id, n := range v.held {
		if id != s.id && n > 0 {
			return false, false // a running cluster: not cold
		}
	}
	if since < shardColdSettle {
		return true, false
	}
	if !s.registered.Load() {
		return true, false // its own registration not read yet: it waits for it
	}
	rank := slices.Index(*ids, s.id)
	return true, rank >= 0 && sh.i%len(*ids) == rank
}

// shardView is who leads each shard and who waits, as one range read of
// every shard's election saw it.
type shardView struct {
	leaders []string       // by shard: the leader's id, "" for none
	waiters [][]string     // by shard: the ids of the candidates behind the leader
	held    map[string]int // shards each replica leads
	// freeSince is by shard since when the reads have seen it led by
	// nobody (zero: it is led), and lastLeader who led it before.
	freeSince  []time.Time
	lastLeader []string
}

// owedWaiter says whether the candidate next in line for shard i, which
// id leads, leads at least two fewer shards than id: a handover to it
// evens the split. One that leads one fewer would lead one more after
// it, and the shard would go back and forth (each move a load of its
// entries and a term's start) without the split getting better.
func (v *shardView) owedWaiter(i int, id string) bool {
	if len(v.waiters[i]) == 0 {
		return false
	}
	w := v.waiters[i][0]
	return w != id && v.held[w]+1 < v.held[id]
}

// readView reads every shard's election: each shard's candidates alone
// (etcdscan.Prefixes, one snapshot), never the shards' state tables and
// runtime entries beside them, which a read of all of keys.Shards would
// return every shardBalanceEvery (at 900,000 entries, the definitions'
// ~170 MB per read, which etcd builds whole and cannot serve).
func (s *shardSet) readView(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	prefixes := make([]string, len(s.shards))
	for i, sh := range s.shards {
		prefixes[i] = keys.Leaders(sh.prefix)
	}
	v := &shardView{leaders: make([]string, s.n), waiters: make([][]string, s.n), held: map[string]int{}}
	_, err := etcdscan.Prefixes(rctx, s.cli, prefixes, func(i int, kvs []*mvccpb.KeyValue) {
		// The candidates in the order they win: the oldest leads.
		kvs = slices.SortedFunc(slices.Values(kvs), func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
		for j, kv := range kvs {
			if j == 0 {
				v.leaders[i] = string(kv.Value)
			} else {
				v.waiters[i] = append(v.waiters[i], string(kv.Value))
			}
		}
	})
	if err != nil {
		return // keep the last view: an etcd outage moves nothing
	}
	now, last := s.clock.Now(), s.view.Load()
	v.freeSince, v.lastLeader = make([]time.Time, s.n), make([]string, s.n)
	for i, id := range v.leaders {
		switch {
		case id != "":
			v.held[id]++
		case last != nil && last.freeSince != nil && !last.freeSince[i].IsZero():
			v.freeSince[i], v.lastLeader[i] = last.freeSince[i], last.lastLeader[i]
		default:
			v.freeSince[i] = now
			if last != nil {
				v.lastLeader[i] = last.leaders[i]
			}
		}
	}
	s.view.Store(v)
}

// Leading is one shard's led term, for /status.
type shardLead struct {
	Shard   int
	Token   int64
	Elected time.Time // zero when the loop's term is not this one
}

// leading returns the shards this replica leads, with their tokens.
func (s *shardSet) leading() []shardLead {
	var out []shardLead
	for _, sh := range s.shards {
		sh.mu.Lock()
		if sh.handover != nil {
			l := shardLead{Shard: sh.i, Token: sh.token}
			if tok, elected := sh.loop.Term(); tok == sh.token {
				l.Elected = elected
			}
			out = append(out, l)
		}
		sh.mu.Unlock()
	}
	return out
}

// token is shard i's current term's token on this replica (0: it does
// not lead it).
func (s *shardSet) token(i int) int64 { return s.shards[i].loop.Token() }

// leads says whether this replica holds a term of shard i.
func (s *shardSet) leads(i int) bool {
	sh := s.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.handover != nil
}

// termErr is why a shard this replica leads cannot do its work, each
// named by its shard (nil: every one can), for /readyz.
func (s *shardSet) termErr(now time.Time) error {
	var errs []error
	for _, sh := range s.shards {
		sh.mu.Lock()
		leading := sh.handover != nil
		sh.mu.Unlock()
		if !leading {
			continue
		}
		if err := termErr(sh.sched, sh.pub, now); err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", sh.i, err))
		}
	}
	return errors.Join(errs...)
}

// stopped reports whether a shard's leadership loop has stopped, and
// which.
func (s *shardSet) stopped() (int, bool) {
	for _, sh := range s.shards {
		if sh.loop.Stopped() {
			return sh.i, true
		}
	}
	return 0, false
}

// balance reads the live replicas and hands over a surplus shard each
// shardBalanceEvery, until ctx ends.
func (s *shardSet) balance(ctx context.Context) {
	t := s.clock.NewTicker(shardBalanceEvery)
	defer t.Stop()
	for {
		s.readLive(ctx)
		s.readView(ctx)
		if lo, _ := s.share(); s.held() > lo {
			s.handOverOne()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}

// readLive counts the replicas that share the shards: the registered
// ones, less those whose own path to the broker fails while another's
// works (they hand their shards over, brokerha.go, so the others' share
// is all of them). When no replica reaches the broker (an outage, not a
// path) every registered one counts.
func (s *shardSet) readLive(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	reps, err := election.Replicas(rctx, s.cli, s.prefix)
	if err != nil {
		return // keep the last count: an etcd outage moves nothing
	}
	var ids, all []string
	loads := make([][]string, s.n)
	others := &otherReplicas{registered: make(map[string]bool, len(reps))}
	for _, r := range reps {
		others.registered[r.ID] = true
		if r.ID != s.id {
			others.busy = others.busy || r.Busy
			others.waiting = others.waiting || r.Waiting
		}
		if r.Draining {
			continue // handing its shards over to exit
		}
		all = append(all, r.ID)
		if r.Broker == "ok" || r.Broker == "" {
			ids = append(ids, r.ID)
		}
		for _, i := range r.Loading {
			if r.ID != s.id && i >= 0 && i < s.n {
				loads[i] = append(loads[i], r.ID)
			}
		}
	}
	s.loads.Store(&loads)
	s.others.Store(others)
	if len(ids) == 0 {
		ids = all
	}
	registered := slices.Contains(all, s.id)
	s.registered.Store(registered)
	if !registered && !s.draining.Load() {
		// Its own registration lapsed (or is not written yet): it runs,
		// so it counts, rather than ranking itself out of every share.
		ids = append(ids, s.id)
	}
	slices.Sort(ids)
	s.ids.Store(&ids)
	s.live.Store(int64(len(ids)))
}

// shardDrainBudget bounds how long a replica that exits hands its shards
// over one by one to replicas that have loaded them (drain), before it
// lets the rest go at once.
const shardDrainBudget = 10 * time.Second

// maxShardDrain bounds --shard-drain-timeout: a stop is not a wait on
// others without end.
const maxShardDrain = 10 * time.Minute

// shardDrainEvery is how often a draining replica reads the elections
// for candidates waiting on its shards.
const shardDrainEvery = 100 * time.Millisecond

// drain hands every shard this replica leads to another replica before it
// exits: it says in its registration that it is draining, so the others
// count it out and load its shards (its every shard is surplus to them,
// wants); and it ends the term of each shard whose election has a
// candidate waiting, which has loaded the shard, so each move costs the
// new leader's state read only. It returns when it leads nothing, when no
// other replica is live to take a shard, or after budget; what it still
// leads then is let go at once by the stop (whoever takes it loads it
// after winning).
func (s *shardSet) drain(ctx context.Context, budget time.Duration) {
	if s.held() == 0 {
		return
	}
	s.draining.Store(true)
	s.pokeRegistration()
	s.log.Info("draining: handing every shard over to a replica that has loaded it", "held", s.held(), "budget", budget.String())
	t := s.clock.NewTicker(shardDrainEvery)
	defer t.Stop()
	deadline := s.clock.Now().Add(budget)
	handed := map[int]bool{} // ended, their terms finishing
	for s.held() > 0 && s.clock.Now().Before(deadline) {
		s.readLive(ctx)
		if ids := s.ids.Load(); ids != nil && len(*ids) == 0 {
			break // nobody to hand over to
		}
		s.readView(ctx)
		if v := s.view.Load(); v != nil {
			// One at a time, in a quiet cluster (quiet).
			next := slices.IndexFunc(s.shards, func(sh *shard) bool {
				sh.mu.Lock()
				defer sh.mu.Unlock()
				return sh.handover != nil && !handed[sh.i] && v.leaders[sh.i] == s.id && len(v.waiters[sh.i]) > 0
			})
			if next < 0 {
				s.noMove()
			} else if s.quiet(min(handoverQuietWait, s.clock.Until(deadline)/time.Duration(s.held()+1))) {
				sh := s.shards[next]
				sh.mu.Lock()
				handover := sh.handover
				sh.mu.Unlock()
				if handover != nil {
					handed[sh.i] = true
					s.moved()
					s.log.Info("handing a shard over to a replica that has loaded it, to exit", "shard", sh.i)
					handover()
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
	if n := s.held(); n > 0 {
		s.log.Info("draining: letting the shards nobody took go at once", "held", n)
	}
}

// handOverAll resigns every shard this replica leads at once, so the
// replicas waiting in their elections lead them, and ends each term (a
// publish stuck on a cut path may take its timeout to give up; the next
// leader's fence refuses whatever it still sends).
func (s *shardSet) handOverAll(ctx context.Context) {
	for _, sh := range s.shards {
		sh.mu.Lock()
		handover, resign := sh.handover, sh.resign
		if handover != nil {
			sh.handedAt = s.clock.Now()
		}
		sh.mu.Unlock()
		if handover == nil {
			continue
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if err := resign(rctx); err != nil {
			s.log.Warn("resign for the handover failed; the term ends anyway", "shard", sh.i, "err", err)
		}
		cancel()
		handover()
	}
}

// publishFailingSince is since when the publishes of a shard this replica
// leads have failed, the earliest (zero: none fails).
func (s *shardSet) publishFailingSince() time.Time {
	var since time.Time
	for _, sh := range s.leadingShards() {
		if p := sh.sched.PublishFailingSince(); !p.IsZero() && (since.IsZero() || p.Before(since)) {
			since = p
		}
	}
	return since
}

// publishError is the last publish error of a shard this replica leads.
func (s *shardSet) publishError() error {
	for _, sh := range s.leadingShards() {
		if err := sh.sched.PublishError(); err != nil {
			return fmt.Errorf("shard %d: %w", sh.i, err)
		}
	}
	return nil
}

// leadingShards are the shards this replica leads now.
func (s *shardSet) leadingShards() []*shard {
	var out []*shard
	for _, sh := range s.shards {
		sh.mu.Lock()
		if sh.handover != nil {
			out = append(out, sh)
		}
		sh.mu.Unlock()
	}
	return out
}

// handOverOne ends the term of one led shard whose next candidate leads
// at least two fewer shards than this replica (owedWaiter), so that
// candidate leads it as soon as this replica resigns. A replica waits for
// a led shard only when it is owed one (wants), as its view says; the
// count is checked here too, as two views read apart can disagree. A
// shard nobody waits for is kept: handing it over would leave it unled
// until somebody campaigns.
func (s *shardSet) handOverOne() {
	v := s.view.Load()
	if v == nil {
		return
	}
	// A term handed over is not handed again while it ends (its last
	// state write, its resign): it would be logged, and counted, as
	// another move.
	next := slices.IndexFunc(s.shards, func(sh *shard) bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.handover != nil && !sh.handing && v.leaders[sh.i] == s.id && v.owedWaiter(sh.i, s.id)
	})
	if next < 0 {
		s.noMove()
		return
	}
	if !s.quiet(handoverQuietWait) {
		return
	}
	sh := s.shards[next]
	sh.mu.Lock()
	handover := sh.handover
	if handover != nil && !sh.handing {
		sh.handedAt, sh.handing = s.clock.Now(), true
	} else {
		handover = nil
	}
	sh.mu.Unlock()
	if handover == nil {
		return // its term ended meanwhile
	}
	s.moved()
	lo, hi := s.share()
	s.log.Info("handing a shard over to a replica that leads less than its share", "shard", sh.i, "held", s.held(), "share_min", lo, "share_max", hi)
	handover()
}

// gatedElector campaigns for a shard only while the replica wants more
// shards, and withdraws from the election (its candidate key goes with
// its lease) once it has its share, so no surplus shard falls to it.
type gatedElector struct {
	s     *shardSet
	sh    *shard
	inner leader.Elector
}

// errWithdrawn ends a campaign that the replica no longer needs.
var errWithdrawn = errors.New("shards: campaign withdrawn at the replica's share")

func (g gatedElector) Campaign(ctx context.Context) (leader.Lease, error) {
	t := g.s.clock.NewTicker(shardBalanceEvery)
	defer t.Stop()
	for {
		for !g.s.wants(g.sh) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.Chan():
			}
		}
		if ok, err := g.s.prepare(ctx, g.sh); !ok {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if err != nil {
				g.s.log.Warn("loading a shard's entries before campaigning for it failed; trying again", "shard", g.sh.i, "err", err)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.Chan():
			}
			continue
		}
		cctx, withdraw := context.WithCancelCause(ctx)
		watching := make(chan struct{})
		go func() {
			defer close(watching)
			for {
				select {
				case <-cctx.Done():
					return
				case <-t.Chan():
					if !g.s.wants(g.sh) {
						withdraw(errWithdrawn)
						return
					}
				}
			}
		}()
		l, err := g.inner.Campaign(cctx)
		withdrawn := errors.Is(context.Cause(cctx), errWithdrawn)
		withdraw(nil)
		<-watching
		if err != nil {
			g.s.unprepare(g.sh)
			if withdrawn && ctx.Err() == nil {
				continue
			}
		}
		return l, err
	}
}

// checkShardsFlag checks --shards before anything starts.
func checkShardsFlag(n int) error {
	if n < 1 {
		return fmt.Errorf("--shards must be 1 or more, not %d", n)
	}
	if n > maxShards {
		return fmt.Errorf("--shards must be at most %d, not %d", maxShards, n)
	}
	return nil
}

// maxShards bounds --shards: each shard is an election and a loop on every
// replica.
const maxShards = 256

// newShards builds the shards' leadership, each shard's scheduler as the
// replica's (schedCfg) but with its own dispatcher, fenced on its own,
// and its own state table.
//
// On RabbitMQ each shard has its own fence lock and journal, and its term
// is checked against its shard's election; the shards' dispatchers
// register no metrics (beatd_amqp_resends_total is the replica's, from
// the unsharded dispatcher, which a sharded replica never runs).
func (m *Main) newShards(cfg *config.Config, schedCfg scheduler.Config, redisOpts redisbroker.Options, amqpOpts amqpbroker.AMQPOptions) (*shardSet, error) {
	prefix := m.Etcd.KeyPrefix()
	return newShardSet(m.etcd, prefix, m.Shards, cfg, shardDeps{
		sched: schedCfg,
		dispatch: func(i int) (scheduler.Dispatcher, error) {
			if amqpbroker.IsAMQPURL(m.Broker) {
				o := amqpOpts
				o.Shard, o.Verify, o.Registerer = strconv.Itoa(i), amqpVerify(m.etcd, keys.Shard(prefix, i, m.Shards)), nil
				return amqpbroker.NewAMQP(o)
			}
			o := redisOpts
			o.Shard = strconv.Itoa(i)
			return redisbroker.New(m.rdb, o), nil
		},
		store: func(i int) scheduler.StateStore {
			st := store.New(m.etcd, keys.Shard(prefix, i, m.Shards)).WithMaxOps(m.EtcdMaxTxnOps).WithClock(m.clock)
			st.SetAuditKeep(m.AuditKeep)
			return &shardStore{Store: st, cluster: m.store, shard: i, n: m.Shards}
		},
		leaseTTL: m.LeaseTTL, id: m.ID, lead0: m.publishCatalog, perEntryLimit: m.metricsPerEntryLimit,
		observe: m.shardObserver, hold: m.electionHold, defs: m.shardDefs, release: m.release, lift: m.lift,
	}, m.registry, m.log)
}

// shardStore is a shard's StateStore: its state table is the shard's,
// while admin requests and backfill jobs stay the cluster's (any replica
// queues them under the cluster's prefix), each seen only by the shard
// that holds its entry. A completed request is deleted by its full key,
// and a backfill job is saved under the shard leader's fence, so neither
// needs the shard's prefix.
type shardStore struct {
	*store.Store              // the shard's state table
	cluster      *store.Store // the cluster's requests and backfills
	shard, n     int
}

// PendingRequests is the cluster's queued requests for this shard's
// entries.
func (s *shardStore) PendingRequests(ctx context.Context) ([]store.Request, int64, error) {
	reqs, rev, err := s.cluster.PendingRequests(ctx)
	mine := reqs[:0]
	for _, r := range reqs {
		if keys.ShardOf(r.Entry, s.n) == s.shard {
			mine = append(mine, r)
		}
	}
	return mine, rev, err
}

// WatchRequests wakes on any request queued in the cluster; the loop
// then reads only its own (PendingRequests).
func (s *shardStore) WatchRequests(ctx context.Context, rev int64) <-chan struct{} {
	return s.cluster.WatchRequests(ctx, rev)
}

// Backfill reads a job of the cluster's.
func (s *shardStore) Backfill(ctx context.Context, id string) (store.Backfill, bool, error) {
	return s.cluster.Backfill(ctx, id)
}

// Backfills is the cluster's jobs for this shard's entries.
func (s *shardStore) Backfills(ctx context.Context) ([]store.Backfill, error) {
	jobs, err := s.cluster.Backfills(ctx)
	mine := jobs[:0]
	for _, j := range jobs {
		if keys.ShardOf(j.Entry, s.n) == s.shard {
			mine = append(mine, j)
		}
	}
	return mine, err
}

// SaveBackfill saves a job of the cluster's, under this shard's fence.
func (s *shardStore) SaveBackfill(ctx context.Context, g election.Fence, b *store.Backfill, also ...string) error {
	return s.cluster.SaveBackfill(ctx, g, b, also...)
}

// TrimBackfills trims the cluster's finished jobs, under this shard's
// fence.
func (s *shardStore) TrimBackfills(ctx context.Context, g election.Fence) error {
	return s.cluster.TrimBackfills(ctx, g)
}

var (
	_ scheduler.StateStore    = (*shardStore)(nil)
	_ scheduler.BackfillStore = (*shardStore)(nil)
)
