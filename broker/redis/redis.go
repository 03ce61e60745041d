package redis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
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
func (p *Publisher) slotsTermKey() string { return p.prefix + "slots-term" }
func (p *Publisher) legacyKey() string    { return p.prefix + "legacy-dedup" }

// TriggerKey marks a manual trigger (by its request id) as pushed.
func (p *Publisher) TriggerKey(request string) string { return p.prefix + "trigger:" + request }

// BackfillKey is a running backfill's cursor: the last slot it pushed.
// One key per unfinished backfill; EndBackfill drops it.
func (p *Publisher) BackfillKey(id string) string { return p.prefix + "backfill:" + id }

// DedupKey is the previous release's per-fire dedup key of (entry, slot).
// This release writes it only while legacyKey exists.
func (p *Publisher) DedupKey(id [36]byte) string { return p.prefix + "dedup:" + string(id[:]) }

// publishScript is the whole publish of a batch of fires, atomic in
// Redis:
//  1. compare the token with the fence: lower is stale (the whole batch
//     is refused), higher raises it;
//  2. SADD each Kombu binding the batch carries: the publisher sends each
//     one once per term, so a restored message is never dropped;
//  3. dedup each fire. A scheduled fire's slot is checked against its
//     entry's high-water mark, the last slot published, which the newest
//     record of the entry's run history carries (LINDEX 0): at or below it
//     is a duplicate, and nothing else happens for that fire. A manual
//     fire claims its trigger key (SET NX PX). A backfill's fire (its
//     slot argument starts with "b") is checked against its job's
//     cursor, the last slot the job published: at or below it is a
//     duplicate; a push moves the cursor (for the legacy TTL, or until
//     the job ends) and leaves the mark alone, since the slot is past.
//  4. LPUSH the message;
//  5. LPUSH the run record, "<mark> <runs> " and the record Go built: it
//     advances the mark and counts the run in the same write, so a fire
//     costs three commands (read the head, push the message, push the
//     record), and the list is trimmed to the history length once it
//     holds twice that, which keeps trimming off the per-fire path.
//
// The mark is exact because an entry's slots reach the script in order:
// the scheduler fires them in order and puts failed ones back in front,
// the publisher keeps an entry's fires of one Publish in one script call
// (callPlan), and here, once a fire of an entry fails, its later fires in
// the call are not attempted either.
//
// A fire whose LPUSH fails (the queue key holds another type) leaves the
// mark (or trigger key) as it was and gets -2: it stays pending, is
// retried, and does not hold up other entries. A history key of another
// type fails the LINDEX before anything of that fire is written, which
// aborts the call: its earlier fires are then duplicates on the retry.
//
// While legacyKey exists (an older release led since this release last
// did), a scheduled fire is also a duplicate if the older release's dedup
// key exists, and a pushed one writes that key, so neither release
// repeats the other's slots during a rolling upgrade. An entry whose
// newest record is the older release's carries its count on from that
// release's run-count hash.
//
// KEYS: fence, the previous release's run counts, slots-term, the legacy
// flag, the entries registry, then per fire: queue, history, dedup (the
// trigger key, or the legacy dedup key); then the bindings. ARGV: token,
// history length (at least 1: the newest record is the mark), number of
// fires, legacy TTL ms, trigger TTL ms, the history keys' prefix length,
// then per fire: message, run record, slot (Unix microseconds, "" for a
// manual fire); then the bindings' members. Returns one result per fire:
// 1 pushed, 0 duplicate, -1 stale, -2 failed.
var publishScript = redis.NewScript(`
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local out = {}
if token < fence then
  for i = 1, n do out[i] = -1 end
  return out
end
if token > fence then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[3], ARGV[1])
end
for b = 6 + 3 * n, #KEYS do
  redis.pcall('SADD', KEYS[b], ARGV[b + 1])
end
local keep = tonumber(ARGV[2])
local plen = tonumber(ARGV[6])
local legacy = redis.call('EXISTS', KEYS[4]) == 1
local failed = {}
for i = 1, n do
  local k, a = 3 * i + 3, 3 * i + 4
  local hist, slot = KEYS[k + 1], ARGV[a + 2]
  local mark, runs = '', nil
  local head = redis.call('LINDEX', hist, 0)
  if head then
    local m, r = string.match(head, '^(%d*) (%d+) ')
    if r then mark, runs = m, tonumber(r) end
  end
  local fresh
  local bf = string.byte(slot) == 98
  if failed[hist] then
    out[i] = -2
  elseif slot == '' then
    fresh = redis.call('SET', KEYS[k + 2], ARGV[1], 'NX', 'PX', ARGV[5])
  elseif bf then
    slot = string.sub(slot, 2)
    local cur = redis.call('GET', KEYS[k + 2])
    fresh = not cur or tonumber(cur) < tonumber(slot)
  else
    fresh = mark == '' or tonumber(mark) < tonumber(slot)
    if fresh and legacy and redis.call('EXISTS', KEYS[k + 2]) == 1 then fresh = false end
  end
  if fresh then
    local pushed = redis.pcall('LPUSH', KEYS[k], ARGV[a])
    if type(pushed) == 'table' and pushed.err then
      if slot == '' then redis.call('DEL', KEYS[k + 2]) else failed[hist] = true end
      out[i] = -2
    else
      if not runs then
        local entry = string.sub(hist, plen + 1)
        runs = tonumber(redis.call('HGET', KEYS[2], entry) or '0')
        redis.call('HSET', KEYS[5], entry, 1)
      end
      if bf then
        redis.call('SET', KEYS[k + 2], slot, 'PX', ARGV[4])
      elseif slot ~= '' then
        mark = slot
        if legacy then redis.call('SET', KEYS[k + 2], ARGV[1], 'PX', ARGV[4]) end
      end
      local len = redis.call('LPUSH', hist, mark .. ' ' .. (runs + 1) .. ' ' .. ARGV[a + 1])
      if len > 2 * keep then redis.call('LTRIM', hist, 0, keep - 1) end
      out[i] = 1
    end
  elseif out[i] == nil then
    out[i] = 0
  end
end
return out
`)

// scriptBatch is about the most fires one script call carries. Larger
// batches hold Redis (single-threaded) for longer per call; 64 already
// makes the per-call overhead small next to the per-fire work.
const scriptBatch = 64

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
	// script.
	KeyPrefix string
	// DedupTTL is how long the previous release's per-fire dedup keys
	// live (its --dedup-ttl): the legacy window after an upgrade.
	DedupTTL time.Duration
	// TriggerTTL is how long a manual trigger is remembered as pushed
	// (default DefaultTriggerTTL): its request must be completed in etcd
	// within it, or a failover publishes it again.
	TriggerTTL time.Duration
	// Now reads the clock; a relative expiry counts from it.
	Now func() time.Time
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
	ttlArg   string
	trigArg  string
	keepArg  string
	// histPrefixLen is len(historyKey("")), for the script to find an
	// entry's name in its history key.
	histPrefixLen string
	keep          int
	cluster       string // task ids' namespace, to name a scheduled run's task
	now           func() time.Time
	bufs          sync.Pool
	repl          *replication

	// legacy: this term found the legacy window open (RaiseFence).
	legacy atomic.Bool

	sentFrom    string        // task-sent events' hostname; "" sends none
	sentChannel string        // /<db>.celeryev/task.sent
	sentClock   atomic.Uint64 // the events' Lamport clock

	// fixed are every publish call's first keys, boxed once.
	fixed []any

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
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.History == 0 {
		opts.History = DefaultHistory
	}
	opts.History = max(opts.History, 0)
	p := &Publisher{
		rdb:           rdb,
		fenceKey:      opts.KeyPrefix + "fence",
		prefix:        opts.KeyPrefix,
		ttlArg:        strconv.FormatInt(opts.DedupTTL.Milliseconds(), 10),
		trigArg:       strconv.FormatInt(opts.TriggerTTL.Milliseconds(), 10),
		keepArg:       strconv.Itoa(max(opts.History, 1)),
		keep:          opts.History,
		histPrefixLen: strconv.Itoa(len(opts.KeyPrefix + "runs:")),
		cluster:       opts.Cluster,
		now:           opts.Now,
		bufs:          sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }},
		repl:          newReplication(opts),
		sentFrom:      opts.SentEventsFrom,
		sentChannel:   fmt.Sprintf("/%d.celeryev/task.sent", opts.SentEventsDB),
	}
	p.fixed = []any{p.fenceKey, p.countsKey(), p.slotsTermKey(), p.legacyKey(), p.entriesKey()}
	return p
}

// RaiseFence raises the Redis fence to token. A new leader calls it before
// it publishes anything, so a deposed leader is refused from then on. It
// returns ErrStale if a larger token already holds the fence.
func (p *Publisher) RaiseFence(ctx context.Context, token int64) error {
	v, err := fenceScript.Run(ctx, p.rdb, []string{p.fenceKey, p.slotsTermKey(), p.legacyKey()}, token, p.ttlArg).Int64()
	if err != nil {
		return fmt.Errorf("publisher: raise fence: %w", err)
	}
	if v > token {
		return fmt.Errorf("%w: fence is %d, token %d", broker.ErrStale, v, token)
	}
	// A fence lost in a failover would let a deposed leader publish again.
	if err := p.repl.sync(ctx, p.rdb, strconv.FormatInt(token, 10)); err != nil {
		p.repl.failed()
		return fmt.Errorf("publisher: raise fence: %w", err)
	}
	// Only a term that opened (or found) the legacy window sends the old
	// dedup keys' names; the flag cannot appear later in the term, since
	// only a fence raise sets it.
	n, err := p.rdb.Exists(ctx, p.legacyKey()).Result()
	if err != nil {
		return fmt.Errorf("publisher: raise fence: %w", err)
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

// Publish pushes every fire, in flights of pipelined script calls, and
// stores each outcome in results (len(results) must equal len(fires)). A
// non-nil error means some fires may not have been attempted; their result
// is ResultError and retrying them is safe, since each entry's high-water
// mark makes a repeat a no-op.
func (p *Publisher) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	if len(fires) == 0 {
		return nil
	}
	now := p.now()
	err := p.run(ctx, token, fires, now, results)
	if err != nil && isNoScript(err) {
		// The script cache was flushed (a restart or SCRIPT FLUSH): load it
		// and try once more. Anything already pushed dedups.
		if lerr := publishScript.Load(ctx, p.rdb).Err(); lerr != nil {
			return fmt.Errorf("publisher: load script: %w", lerr)
		}
		err = p.run(ctx, token, fires, now, results)
	}
	if err != nil {
		p.repl.failed()
		return fmt.Errorf("publisher: publish %d fires: %w", len(fires), err)
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

// flightFires is about how many fires one pipeline carries. A Publish
// sends its script calls in flights of this size, each on its own
// connection as soon as it is encoded, so Redis runs one flight while the
// next is encoded: a burst costs about the larger of the two, not their
// sum. The order between flights does not matter: an entry's fires are
// all in one call. With --broker-min-replicas each flight ends with its
// own WAIT (TestSentinelFailoverNoLostSlot caught a single WAIT on another
// connection passing on the new master while the flights' writes went to
// the old one).
const flightFires = 128

func (p *Publisher) run(ctx context.Context, token int64, fires []celery.Fire, now time.Time, results []broker.Result) error {
	pl := plans.Get().(*plan)
	defer pl.release()
	order, cuts := pl.make(fires)
	cmds := make([]*redis.Cmd, len(cuts))
	tok := strconv.FormatInt(token, 10)
	fixed := p.fixed
	want := p.repl.target(ctx, p.rdb)
	bindings := p.bindings(token, fires)
	legacy := p.legacy.Load()
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	// The flights read spans of buf while later calls append to it: an
	// append never writes a byte a span holds, and a span keeps the array
	// it was cut from if buf grows.
	buf := (*bp)[:0]
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		execErr  error
		pipe     = p.rdb.Pipeline()
		inFlight int
	)
	var waits []*redis.IntCmd
	send := func(pipe redis.Pipeliner) {
		// WAIT counts the replicas that hold this connection's writes, on
		// the server that took them: each flight waits for its own (a
		// failover between flights may send them to different masters).
		if w := p.repl.queue(ctx, pipe, want, tok); w != nil {
			waits = append(waits, w)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := pipe.Exec(ctx); err != nil {
				mu.Lock()
				if execErr == nil {
					execErr = err
				}
				mu.Unlock()
			}
		}()
	}
	lo := 0
	for c, hi := range cuts {
		call := order[lo:hi]
		// EVALSHA's arguments in one slice, as go-redis's EvalSha would
		// build them from a keys and an args slice, with a copy: "evalsha",
		// sha, numkeys, the keys, then the arguments. The keys go first,
		// then each fire is encoded for its arguments.
		var binds []binding
		if c == 0 { // each new binding once: the first call carries them
			binds = bindings
		}
		nkeys := len(fixed) + 3*len(call) + len(binds)
		argv := pl.argv(3 + nkeys + 6 + 3*len(call) + len(binds))
		argv = append(argv, "evalsha", publishScript.Hash(), nkeys)
		argv = append(argv, fixed...)
		for _, i := range call {
			f := &fires[i]
			t := f.Task
			switch {
			case f.Manual:
				argv = append(argv, t.QueueKey, p.historyKey(t.Name), p.TriggerKey(f.RequestKey()))
			case f.Backfill != "":
				argv = append(argv, t.QueueKey, p.historyKey(t.Name), p.BackfillKey(f.Backfill))
			case legacy:
				f.Task.AssignID(f)
				argv = append(argv, t.QueueKey, p.historyKey(t.Name), p.DedupKey(f.ID))
			default:
				// The dedup key is unread outside the legacy window: no
				// key is built per fire.
				argv = append(argv, t.QueueKey, p.historyKey(t.Name), t.QueueKey)
			}
		}
		for _, b := range binds {
			argv = append(argv, b.key)
		}
		argv = append(argv, tok, p.keepArg, len(call), p.ttlArg, p.trigArg, p.histPrefixLen)
		for _, i := range call {
			f := &fires[i]
			start := len(buf)
			buf = f.Task.AppendMessage(buf, f, token, now)
			mid := len(buf)
			buf = appendRun(buf, f, token, now)
			msg, run := buf[start:mid:mid], buf[mid:len(buf):len(buf)]
			switch {
			case f.Manual:
				argv = append(argv, msg, run, "")
			case f.Backfill != "":
				argv = append(argv, msg, run, "b"+strconv.FormatInt(f.Slot.UnixMicro(), 10))
			default:
				argv = append(argv, msg, run, strconv.FormatInt(f.Slot.UnixMicro(), 10))
			}
		}
		for _, b := range binds {
			argv = append(argv, b.member)
		}
		pl.keep(argv)
		cmd := redis.NewCmd(ctx, argv...)
		cmd.SetFirstKeyPos(3)
		_ = pipe.Process(ctx, cmd)
		cmds[c] = cmd
		lo = hi
		if inFlight += len(call); inFlight >= flightFires || c == len(cuts)-1 {
			send(pipe)
			pipe, inFlight = p.rdb.Pipeline(), 0
		}
	}
	wg.Wait()
	*bp = buf[:0]
	err := execErr
	var first error
	lo = 0
	for c, cmd := range cmds {
		call := order[lo:cuts[c]]
		lo = cuts[c]
		vals, cerr := cmd.Int64Slice()
		if cerr == nil && len(vals) != len(call) {
			cerr = fmt.Errorf("publish script returned %d results for %d fires", len(vals), len(call))
		}
		if c == 0 && cerr != nil {
			p.unbind(bindings) // not written: the next publish carries them
		}
		for j, i := range call {
			switch {
			case cerr != nil:
				results[i] = broker.ResultError
			case vals[j] == 1:
				results[i] = broker.ResultOK
			case vals[j] == 0:
				results[i] = broker.ResultDuplicate
			case vals[j] == -2:
				results[i] = broker.ResultError
				if first == nil {
					first = fmt.Errorf("entry %q: LPUSH to %s failed (does the key hold another type?)", fires[i].Task.Name, fires[i].Task.QueueKey)
				}
			default:
				results[i] = broker.ResultStale
			}
		}
		if cerr != nil && first == nil {
			first = cerr
		}
	}
	if len(waits) == 0 {
		_ = p.repl.check(nil, want, results) // nothing to wait for
	}
	for _, w := range waits {
		// One flight short of replicas leaves the whole publish pending:
		// what did reach them dedups on the retry.
		if werr := p.repl.check(w, want, results); werr != nil && first == nil {
			first = werr
		}
	}
	// Exec's error says why when the connection itself failed (a refused
	// AUTH leaves every reply empty, and its command's error reads only
	// "unexpected type=<nil>"); otherwise it is the first command's.
	if err != nil {
		return err
	}
	return first
}

// callPlan splits one Publish's fires into script calls: order lists the
// fires' indexes call by call, and cuts[c] is where call c ends in order.
// Every fire of one entry lands in one call, in its order, so a slot of an
// entry never runs in Redis before an earlier slot of it that failed (the
// high-water mark would then call the earlier one a duplicate). Calls
// close at scriptBatch fires, on an entry boundary. When each entry fires
// once, the common case, order is the fires' own.
func callPlan(fires []celery.Fire) (order, cuts []int) {
	var pl plan
	order, cuts = pl.make(fires)
	return slices.Clone(order), slices.Clone(cuts)
}

// plan is one Publish's scratch space: its call plan and its commands'
// arguments. Plans are pooled, since a busy leader publishes 512 fires
// at a time many times a second, and each publish's fresh maps and
// slices were a sixth of its allocations.
type plan struct {
	seen   map[*celery.Task]int // task -> its group
	groups [][]int
	order  []int
	cuts   []int
	args   []any   // every call's arguments, back to back
	calls  [][]any // the spans of args handed to commands
}

var plans = sync.Pool{New: func() any { return &plan{seen: map[*celery.Task]int{}} }}

// planMax is the largest scratch a pooled plan keeps, in fires.
const planMax = 4096

func (pl *plan) make(fires []celery.Fire) (order, cuts []int) {
	if pl.seen == nil {
		pl.seen = map[*celery.Task]int{}
	}
	order = pl.order[:0]
	cuts = pl.cuts[:0]
	groups := pl.groups[:0]
	repeated := false
	for i := range fires {
		order = append(order, i)
		g, ok := pl.seen[fires[i].Task]
		if !ok {
			g = len(groups)
			pl.seen[fires[i].Task] = g
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
		for hi := scriptBatch; hi < len(fires); hi += scriptBatch {
			cuts = append(cuts, hi)
		}
		pl.order, pl.cuts = order, append(cuts, len(fires))
		return pl.order, pl.cuts
	}
	order = order[:0]
	size := 0
	for _, g := range groups {
		order = append(order, g...)
		if size += len(g); size >= scriptBatch {
			cuts, size = append(cuts, len(order)), 0
		}
	}
	if size > 0 {
		cuts = append(cuts, len(order))
	}
	pl.order, pl.cuts = order, cuts
	return order, cuts
}

// argv returns an empty slice with room for n arguments. A span handed
// to a command is never written again until release: a call that does
// not fit starts a new array.
func (pl *plan) argv(n int) []any {
	if cap(pl.args)-len(pl.args) < n {
		pl.args = make([]any, 0, max(n, 2*cap(pl.args), 1024))
	}
	return pl.args[len(pl.args) : len(pl.args) : len(pl.args)+n]
}

// keep records that argv, from argv(n), is now a command's.
func (pl *plan) keep(argv []any) {
	if len(pl.args)+len(argv) <= cap(pl.args) {
		pl.args = pl.args[:len(pl.args)+len(argv)]
	}
	pl.calls = append(pl.calls, argv)
}

// release returns pl to the pool, holding no reference to what was sent.
func (pl *plan) release() {
	for _, a := range pl.calls {
		clear(a)
	}
	clear(pl.seen)
	if len(pl.order) > planMax || cap(pl.args) > 16*planMax {
		return // a large publish's scratch is not kept
	}
	pl.args, pl.calls = pl.args[:0], pl.calls[:0]
	plans.Put(pl)
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
			return fmt.Errorf("publisher: forget %d entries: %w", len(batch), err)
		}
		if v < 0 {
			return broker.ErrStale
		}
	}
	return nil
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
