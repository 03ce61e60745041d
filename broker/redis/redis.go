package redis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// The keys beatd keeps in Redis, all under KeyPrefix (docs/brokers.md
// lists them with their sizes). Per entry: one capped list (historyKey),
// whose newest record carries the entry's high-water mark and run count,
// and one field of entriesKey, written at its first fire only. Per
// cluster: the fence, slotsTermKey, and legacyKey while it lives. Per
// manual trigger: one triggerKey for TriggerTTL. Per running backfill:
// one BackfillKey. Nothing else is written per fire.
func (p *Publisher) entriesKey() string   { return p.prefix + "entries" }
func (p *Publisher) slotsTermKey() string { return p.prefix + "slots-term" + p.shard }
func (p *Publisher) legacyKey() string    { return p.prefix + "legacy-dedup" }

// TriggerKey marks a manual trigger (by its request id) as pushed.
func (p *Publisher) TriggerKey(request string) string { return p.prefix + "trigger:" + request }

// BackfillKey is a running backfill's cursor: the last slot it pushed.
// One key per unfinished backfill; EndBackfill drops it.
func (p *Publisher) BackfillKey(id string) string { return p.prefix + "backfill:" + id }

// DedupKey is the previous release's per-fire dedup key of (entry, slot).
// This release writes it only while legacyKey exists.
func (p *Publisher) DedupKey(id [36]byte) string { return p.prefix + "dedup:" + string(id[:]) }

// fenceScript raises the fence to token and returns the fence's value.
// When the fence it raises was last raised by a release that kept
// per-fire dedup keys (the fence is above slots-term), it also sets the
// legacy flag for the legacy TTL, so those keys are honoured while they
// live (legacy.go).
//
// KEYS: fence, slots-term, legacy flag. ARGV: token, legacy TTL ms.
var fenceScript = redis.NewScript(`
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > fence then
  local term = tonumber(redis.call('GET', KEYS[2]) or '0')
  if fence > term then redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2]) end
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], ARGV[1])
  return token
end
return fence
`)

// forgetScript removes what Redis keeps of entries that left the config
// for good (their etcd state is gone), fenced like a publish.
//
// KEYS: fence, the entries registry, the previous release's run counts,
// then each entry's history. ARGV: token, then the entries' names.
// Returns -1 if stale, else 0.
var forgetScript = redis.NewScript(`
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[1]) or '0') then return -1 end
for i = 2, #ARGV do
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i])
  redis.call('DEL', KEYS[2 + i])
end
return 0
`)

// Options configure a Publisher.
type Options struct {
	// Cluster namespaces task ids: UUIDv5 of "<Cluster>/<entry>/<slot>".
	Cluster string
	// KeyPrefix prefixes beatd's own keys (the fence, the run history, the
	// entries registry). Put a hash tag in it, e.g. "beatd:{default}:", and the
	// same tag in Kombu's global_keyprefix, and Redis Cluster can run the
	// publish's transaction.
	KeyPrefix string
	// Shard names the shard of a sharded cluster whose fence this
	// Publisher takes: its fence and slots-term keys end in ":<Shard>",
	// so each shard's leader is fenced on its own. Every other key (the
	// run history with each entry's mark, the registry) is the cluster's:
	// an entry lives in one shard. Empty for a cluster of one shard,
	// whose keys are those of beatd before sharding.
	Shard string
	// DedupTTL is how long the previous release's per-fire dedup keys
	// live (its --dedup-ttl): the legacy window after an upgrade.
	DedupTTL time.Duration
	// TriggerTTL is how long a manual trigger is remembered as pushed
	// (default DefaultTriggerTTL): its request must be completed in etcd
	// within it, or a failover publishes it again.
	TriggerTTL time.Duration
	// Clock is the daemon's clock: a relative expiry counts from its now,
	// the replica re-count and its grace are kept on it, and a refused
	// transaction's retries wait on it (default the real clock).
	Clock clockwork.Clock
	// History is how many runs each entry keeps in Redis for status
	// (default DefaultHistory; negative keeps none).
	History int
	// MinReplicas makes every publish wait (WAIT) until that many replicas
	// hold it; a shortfall leaves the batch's fires pending (replicas.go).
	// ReplicasAuto waits for one whenever the master has one. 0: no wait.
	MinReplicas        int
	MinReplicasTimeout time.Duration // WAIT's timeout; DefaultReplicasTimeout when 0
	// ReplicasAutoGrace: ReplicasAuto waits for a replica this long
	// after the master last had one (DefaultReplicasAutoGrace when 0).
	ReplicasAutoGrace time.Duration
	ReplicaShortfalls prometheus.Counter // counts batches WAIT failed; may be nil
	// SentEventsFrom, when set, publishes a task-sent event for each new
	// message, as this hostname (e.g. beatd@host), on the celeryev fanout
	// of database SentEventsDB: Flower and `celery events` then show
	// beatd's sends. Best effort: a failed event does not fail the publish.
	SentEventsFrom string
	SentEventsDB   int
	// Scratch is the publish scratch space this Publisher reuses. The
	// Publishers of one replica's shards share one (NewScratch); nil
	// gives the Publisher its own.
	Scratch *Scratch
}

// DefaultHistory is the runs each entry keeps.
const DefaultHistory = 20

// DefaultDedupTTL is the previous release's default dedup key lifetime,
// and so the default legacy window.
const DefaultDedupTTL = 7 * 24 * time.Hour

// DefaultTriggerTTL is how long a manual trigger's key lives.
const DefaultTriggerTTL = 24 * time.Hour

// Publisher pushes fires into Redis, fenced and deduplicated.
type Publisher struct {
	rdb      redis.UniversalClient
	fenceKey string
	prefix   string
	shard    string        // ":<Options.Shard>", or empty
	ttlArg   string        // the legacy TTL, for the fence script
	dedupTTL time.Duration // the legacy keys' and backfill cursors' lifetime
	trigTTL  time.Duration
	// keepTrim is the history length the lists are trimmed to (at least
	// 1: the newest record is the mark).
	keepTrim int
	keep     int
	cluster  string // task ids' namespace, to name a scheduled run's task
	clock    clockwork.Clock
	repl     *replication

	// legacy: this term found the legacy window open (RaiseFence).
	legacy atomic.Bool

	sentFrom    string        // task-sent events' hostname; "" sends none
	sentChannel string        // /<db>.celeryev/task.sent
	sentClock   atomic.Uint64 // the events' Lamport clock

	// watchKeys are the keys publishFlight names to Client.Watch: none but
	// on a cluster client (New).
	watchKeys []string

	// pub makes publishes of one Publisher run one at a time. A publish's
	// transaction watches only the fence (tx.go), so two publishes of one
	// entry must not interleave their reads and writes. The leader's loop
	// publishes one batch at a time anyway: this costs it nothing.
	pub sync.Mutex
	// marks are the marks this term wrote or read (tx.go), under pub.
	marks markCache
	// scratch keeps the publishes' scratch space between them.
	scratch *Scratch

	mu    sync.Mutex
	term  int64            // the token bindings were last written under
	bound map[binding]bool // bindings written in term
}

// New returns a Publisher on rdb.
func New(rdb redis.UniversalClient, opts Options) *Publisher {
	if opts.DedupTTL <= 0 {
		opts.DedupTTL = DefaultDedupTTL
	}
	if opts.TriggerTTL <= 0 {
		opts.TriggerTTL = DefaultTriggerTTL
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.History == 0 {
		opts.History = DefaultHistory
	}
	opts.History = max(opts.History, 0)
	shard := ""
	if opts.Shard != "" {
		shard = ":" + opts.Shard
	}
	p := &Publisher{
		rdb:         rdb,
		fenceKey:    opts.KeyPrefix + "fence" + shard,
		shard:       shard,
		prefix:      opts.KeyPrefix,
		ttlArg:      strconv.FormatInt(opts.DedupTTL.Milliseconds(), 10),
		dedupTTL:    opts.DedupTTL,
		trigTTL:     opts.TriggerTTL,
		keepTrim:    max(opts.History, 1),
		keep:        opts.History,
		cluster:     opts.Cluster,
		clock:       opts.Clock,
		repl:        newReplication(opts),
		sentFrom:    opts.SentEventsFrom,
		sentChannel: fmt.Sprintf("/%d.celeryev/task.sent", opts.SentEventsDB),
		scratch:     opts.Scratch,
	}
	if p.scratch == nil {
		p.scratch = NewScratch()
	}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		// A cluster client picks a transaction's node by the key its
		// Watch names, so it is named there as well (a round trip of its
		// own, as before): a flight's own WATCH is then a repeat.
		p.watchKeys = []string{p.fenceKey}
	}
	return p
}

// RaiseFence raises the Redis fence to token. A new leader calls it before
// it publishes anything, so a deposed leader is refused from then on. It
// returns ErrStale if a larger token already holds the fence.
func (p *Publisher) RaiseFence(ctx context.Context, token int64) error {
	p.pub.Lock()
	p.marks.reset(token) // a new term reads every mark afresh
	p.pub.Unlock()
	v, err := fenceScript.Run(ctx, p.rdb, []string{p.fenceKey, p.slotsTermKey(), p.legacyKey()}, token, p.ttlArg).Int64()
	if err != nil {
		return fmt.Errorf("redis: raise fence: %w", err)
	}
	if v > token {
		return fmt.Errorf("%w: fence is %d, token %d", broker.ErrStale, v, token)
	}
	// A fence lost in a failover would let a deposed leader publish again.
	if err := p.repl.sync(ctx, p.rdb, strconv.FormatInt(token, 10)); err != nil {
		p.repl.failed()
		return fmt.Errorf("redis: raise fence: %w", err)
	}
	// Only a term that opened (or found) the legacy window sends the old
	// dedup keys' names; the flag cannot appear later in the term, since
	// only a fence raise sets it.
	n, err := p.rdb.Exists(ctx, p.legacyKey()).Result()
	if err != nil {
		return fmt.Errorf("redis: raise fence: %w", err)
	}
	p.legacy.Store(n == 1)
	return nil
}

// Fence returns the fence's current value (0 when unset).
func (p *Publisher) Fence(ctx context.Context) (int64, error) {
	v, err := p.rdb.Get(ctx, p.fenceKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

// Publish pushes every fire, in flights of one transaction each (tx.go),
// and stores each outcome in results (len(results) must equal
// len(fires)). A non-nil error means some fires may not have been
// attempted; their result is ResultError and retrying them is safe, since
// each entry's high-water mark makes a repeat a no-op.
func (p *Publisher) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	if len(fires) == 0 {
		return nil
	}
	p.pub.Lock()
	now := p.clock.Now()
	err := p.run(ctx, token, fires, now, results)
	p.pub.Unlock()
	if err != nil {
		p.repl.failed()
		return fmt.Errorf("redis: publish %d fires: %w", len(fires), err)
	}
	for _, r := range results {
		if r == broker.ResultStale {
			return broker.ErrStale
		}
	}
	if p.sentFrom != "" {
		p.sendSentEvents(ctx, fires, results, now)
	}
	return nil
}

// sendSentEvents publishes a task-sent event for each fire pushed (not
// for duplicates), in one pipeline.
func (p *Publisher) sendSentEvents(ctx context.Context, fires []celery.Fire, results []broker.Result, now time.Time) {
	pipe := p.rdb.Pipeline()
	n := 0
	ev := celery.SentEvent{Hostname: p.sentFrom, PID: os.Getpid(), Now: now}
	for i := range fires {
		if results[i] != broker.ResultOK {
			continue
		}
		ev.Clock = p.sentClock.Add(1)
		pipe.Publish(ctx, p.sentChannel, fires[i].Task.AppendSentEvent(nil, &fires[i], ev))
		n++
	}
	if n > 0 {
		_, _ = pipe.Exec(ctx) // best effort: the messages are out
	}
}

// flightFires is about the most fires one transaction carries. A
// Publish sends its flights each on its own connection as soon as it is
// encoded, so Redis runs one while the next is encoded: a burst costs
// about the larger of the two, not their sum. The order between flights
// does not matter: an entry's fires are all in one. Larger flights hold
// Redis (single-threaded) for longer per EXEC, and watch more keys. With
// --broker-min-replicas each flight ends with its own WAIT
// (TestSentinelFailoverNoLostSlot caught a single WAIT on another
// connection passing on the new master while the flights' writes went to
// the old one).
const flightFires = 128

func (p *Publisher) run(ctx context.Context, token int64, fires []celery.Fire, now time.Time, results []broker.Result) error {
	pl := p.scratch.get()
	defer p.scratch.put(pl)
	order, cuts := pl.make(fires)
	want := p.repl.target(ctx, p.rdb)
	bindings := p.bindings(token, fires)
	legacy := p.legacy.Load()
	flights := pl.flights(len(cuts))
	errs := make([]error, len(cuts))
	var wg sync.WaitGroup
	// The flights' goroutines read the cache; it is written only after
	// they are done (remember).
	p.marks.forTerm(token)
	lo := 0
	for c, hi := range cuts {
		fl, idx := &flights[c], order[lo:hi]
		lo = hi
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Preparing and encoding are in the flight's goroutine: a
			// burst's flights then do them on every core while this one
			// starts the next, instead of one after another here (a
			// third of a 20,000-entry burst's time). A flight's fires are
			// its own, and a template is only read.
			p.prepare(fl, fires, idx)
			if c == 0 { // each new binding once: the first flight carries them
				fl.binds = bindings
			}
			p.encode(fl, fires, token, now, legacy)
			errs[c] = p.publishFlight(ctx, token, fires, fl, legacy, want)
		}()
	}
	wg.Wait()
	var first, err error
	for c := range flights {
		fl := &flights[c]
		if errs[c] != nil {
			for _, i := range fl.idx {
				results[i] = broker.ResultError
			}
			if c == 0 {
				p.unbind(bindings) // not written: the next publish carries them
			}
			if err == nil {
				err = errs[c]
			}
			continue
		}
		fl.results(results)
		if fl.failure != nil && first == nil {
			first = fl.failure
		}
	}
	waited := false
	for c := range flights {
		if w := flights[c].wait; w != nil && errs[c] == nil {
			waited = true
			// One flight short of replicas leaves the whole publish
			// pending: what did reach them dedups on the retry.
			if werr := p.repl.check(w, want, results); werr != nil && first == nil {
				first = werr
			}
		}
	}
	if !waited {
		_ = p.repl.check(nil, want, results) // nothing to wait for
	}
	p.remember(flights, errs, results)
	// A flight's own error (the connection failed, or a refused AUTH)
	// says more than a fire's.
	if err != nil {
		return err
	}
	return first
}

// encode writes fl's messages and run records into its buffer, kept from
// publish to publish at the size its flights need. A span stays valid if
// the buffer grows: it keeps the array it was cut from.
func (p *Publisher) encode(fl *flight, fires []celery.Fire, token int64, now time.Time, legacy bool) {
	buf := fl.buf[:0]
	for j, i := range fl.idx {
		f := &fires[i]
		start := len(buf)
		buf = f.Task.AppendMessage(buf, f, token, now)
		mid := len(buf)
		buf = appendRun(buf, f, token, now)
		fl.msgs[j], fl.recs[j] = buf[start:mid:mid], buf[mid:len(buf):len(buf)]
		fl.keys[j] = p.dedupKey(f, legacy) // after encoding: it may need the task id
	}
	fl.buf = buf[:0]
}

// callPlan splits one Publish's fires into flights: order lists the
// fires' indexes flight by flight, and cuts[c] is where flight c ends in
// order. Every fire of one entry lands in one flight, in its order, so a
// slot of an entry never reaches Redis before an earlier slot of it that
// failed (the high-water mark would then call the earlier one a
// duplicate), and two flights never contend for one entry's keys. Flights
// close at flightFires fires, on an entry boundary. When each entry fires
// once, the common case, order is the fires' own.
func callPlan(fires []celery.Fire) (order, cuts []int) {
	var pl plan
	order, cuts = pl.make(fires)
	return slices.Clone(order), slices.Clone(cuts)
}

// plan is one Publish's scratch space: its flight plan and the flights,
// with their encoding buffers. A Scratch keeps plans between publishes,
// since a busy leader publishes up to 2,048 fires at a time many times a
// second. It is not a sync.Pool: the GC empties those every other cycle,
// and a leader with a large heap collects often, so each publish grew its
// buffers again from nothing (9% of a 20k leader's CPU was that copying).
type plan struct {
	seen   map[string]int // entry -> its group
	groups [][]int
	order  []int
	cuts   []int
	fls    []flight
}

// planMax is the largest publish whose scratch a Scratch keeps, in
// fires.
const planMax = 4096

func (pl *plan) make(fires []celery.Fire) (order, cuts []int) {
	if pl.seen == nil {
		pl.seen = map[string]int{}
	}
	order = pl.order[:0]
	cuts = pl.cuts[:0]
	groups := pl.groups[:0]
	repeated := false
	for i := range fires {
		order = append(order, i)
		// By name: a reload may recompile an entry's task while fires of
		// the old one are pending, and both share the entry's mark.
		g, ok := pl.seen[fires[i].Task.Name]
		if !ok {
			g = len(groups)
			pl.seen[fires[i].Task.Name] = g
			if g < cap(groups) {
				groups = groups[:g+1]
				groups[g] = groups[g][:0]
			} else {
				groups = append(groups, nil)
			}
		} else {
			repeated = true
		}
		groups[g] = append(groups[g], i)
	}
	pl.groups = groups
	if !repeated {
		for hi := flightFires; hi < len(fires); hi += flightFires {
			cuts = append(cuts, hi)
		}
		pl.order, pl.cuts = order, append(cuts, len(fires))
		return pl.order, pl.cuts
	}
	order = order[:0]
	size := 0
	for _, g := range groups {
		order = append(order, g...)
		if size += len(g); size >= flightFires {
			cuts, size = append(cuts, len(order)), 0
		}
	}
	if size > 0 {
		cuts = append(cuts, len(order))
	}
	pl.order, pl.cuts = order, cuts
	return order, cuts
}

// flights returns n flights, reusing the pooled ones' slices.
func (pl *plan) flights(n int) []flight {
	if cap(pl.fls) < n {
		pl.fls = append(pl.fls[:cap(pl.fls)], make([]flight, n-cap(pl.fls))...)
	}
	pl.fls = pl.fls[:n]
	return pl.fls
}

// prepare makes fl the flight of the fires at idx: one entry state per
// entry, from the term's cache where it has the entry. The cache must be
// the term's (forTerm).
func (p *Publisher) prepare(fl *flight, fires []celery.Fire, idx []int) {
	n := len(idx)
	fl.idx = idx
	fl.msgs = slices.Grow(fl.msgs[:0], n)[:n]
	fl.recs = slices.Grow(fl.recs[:0], n)[:n]
	fl.out = slices.Grow(fl.out[:0], n)[:n]
	fl.grp = slices.Grow(fl.grp[:0], n)[:n]
	fl.extra = slices.Grow(fl.extra[:0], n)[:n]
	fl.keys = slices.Grow(fl.keys[:0], n)[:n]
	fl.ents = fl.ents[:0]
	fl.binds, fl.failure, fl.wait = nil, nil, nil
	for j, i := range idx {
		name := fires[i].Task.Name
		if k := len(fl.ents) - 1; k >= 0 && fl.ents[k].name == name {
			fl.grp[j] = int32(k) // an entry's fires are adjacent (callPlan)
			continue
		}
		fl.grp[j] = int32(len(fl.ents))
		e := entryState{name: name}
		if c := p.marks.m[name]; c != nil {
			e.hist, e.base, e.cached, e.known, e.slot = c.hist, c.mark, true, true, c
		} else {
			e.hist = p.historyKey(name)
		}
		fl.ents = append(fl.ents, e)
	}
}

// remember puts what each flight learned of its entries' marks in the
// term's cache, and drops an entry whose fire did not certainly land (an
// error, a replica shortfall): the next publish reads it from Redis.
func (p *Publisher) remember(flights []flight, errs []error, results []broker.Result) {
	for c := range flights {
		fl := &flights[c]
		bad := errs[c] != nil
		for j, i := range fl.idx {
			e := &fl.ents[fl.grp[j]]
			switch {
			case results[i] == broker.ResultStale:
				p.marks.reset(0) // the term is over
				return
			case bad || results[i] == broker.ResultError:
				e.failed = true // now: not to be cached
			}
		}
		for k := range fl.ents {
			e := &fl.ents[k]
			if bad || e.failed || !e.known {
				delete(p.marks.m, e.name)
				continue
			}
			if e.slot != nil {
				e.slot.mark = e.m // one lookup a fire: prepare's
				continue
			}
			p.marks.put(e.name, e.hist, e.m)
		}
	}
}

// Scratch keeps publish scratch space (plans) for reuse. A plan's
// buffers grow to its largest publish, up to planMax fires: ~4 MB at
// 900,000 entries. A replica leading 6 of 16 shards kept one per shard,
// 23 MB. Its shards' Publishers share one Scratch, which keeps at most
// GOMAXPROCS plans: more publishes at once than that are rare (shards'
// bursts meeting), and a plan made for one of them is dropped after it.
type Scratch struct {
	mu   sync.Mutex
	free []*plan
	max  int
}

// NewScratch returns a Scratch keeping up to GOMAXPROCS plans.
func NewScratch() *Scratch {
	return &Scratch{max: runtime.GOMAXPROCS(0)}
}

// get returns a kept plan, or a new one.
func (s *Scratch) get() *plan {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.free); n > 0 {
		pl := s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
		return pl
	}
	return &plan{}
}

// put keeps pl for a later publish, holding no reference to what was
// sent; a large publish's plan, or one past max, is dropped.
func (s *Scratch) put(pl *plan) {
	if len(pl.order) > planMax {
		return
	}
	for i := range pl.fls {
		fl := &pl.fls[i]
		clear(fl.msgs)
		clear(fl.recs)
		clear(fl.extra)
		clear(fl.keys)
		clear(fl.ents)
		for k := range fl.queues {
			clear(fl.queues[k].args)
			fl.queues[k].typ, fl.queues[k].cmd = nil, nil
		}
		fl.idx, fl.binds, fl.failure, fl.wait = nil, nil, nil, nil
	}
	clear(pl.seen)
	pl.fls = pl.fls[:0]
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) < s.max {
		s.free = append(s.free, pl)
	}
}

// markCacheMax bounds the marks a term remembers. Past it the cache
// starts over: at a million entries most fire rarely, and one LINDEX
// when one does costs less than keeping every mark (~100 B each).
const markCacheMax = 1 << 16

// markCache is a term's marks by entry, with each entry's history key.
type markCache struct {
	term int64
	m    map[string]*cachedMark
}

type cachedMark struct {
	hist string
	mark mark
}

// forTerm empties the cache when token is not its term's.
func (c *markCache) forTerm(token int64) {
	if c.m == nil || c.term != token {
		c.reset(token)
	}
}

func (c *markCache) reset(token int64) { c.term, c.m = token, map[string]*cachedMark{} }

// put adds an entry the cache does not hold.
func (c *markCache) put(name, hist string, m mark) {
	if len(c.m) >= markCacheMax {
		c.m = map[string]*cachedMark{}
	}
	c.m[name] = &cachedMark{hist: hist, mark: m}
}

type binding struct{ key, member string }

// bindings returns the Kombu bindings of fires not yet written in this
// term, and marks them written. Kombu reads a binding only to route a
// restored message, so once per term (and once after a failed write)
// keeps it in place at no per-fire cost.
func (p *Publisher) bindings(token int64, fires []celery.Fire) []binding {
	p.mu.Lock()
	defer p.mu.Unlock()
	if token != p.term || p.bound == nil {
		p.term, p.bound = token, map[binding]bool{}
	}
	var out []binding
	for i := range fires {
		t := fires[i].Task
		if t.BindingKey == "" {
			continue
		}
		// A struct key: no string is built per fire to look it up.
		if k := (binding{t.BindingKey, t.BindingMember}); !p.bound[k] {
			p.bound[k] = true
			out = append(out, k)
		}
	}
	return out
}

// unbind forgets that bs were written, so the next publish writes them.
func (p *Publisher) unbind(bs []binding) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range bs {
		delete(p.bound, b)
	}
}

// Forget removes what Redis keeps of entries gone for good: their history
// (which holds their mark and run count) and their registry field. It is fenced like a publish: ErrStale if a
// newer leader holds the fence.
func (p *Publisher) Forget(ctx context.Context, token int64, entries []string) error {
	p.pub.Lock()
	defer p.pub.Unlock()
	for _, e := range entries {
		delete(p.marks.m, e)
	}
	for len(entries) > 0 {
		batch := entries[:min(len(entries), 256)]
		entries = entries[len(batch):]
		keys := []string{p.fenceKey, p.entriesKey(), p.countsKey()}
		args := []any{token}
		for _, e := range batch {
			keys = append(keys, p.historyKey(e))
			args = append(args, e)
		}
		v, err := forgetScript.Run(ctx, p.rdb, keys, args...).Int64()
		if err != nil {
			return fmt.Errorf("redis: forget %d entries: %w", len(batch), err)
		}
		if v < 0 {
			return broker.ErrStale
		}
	}
	return nil
}
