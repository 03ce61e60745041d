package publisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Result is what the fence script did with one fire.
type Result int8

// Results of a publish.
const (
	ResultError     Result = iota // not attempted, or the transport failed
	ResultOK                      // pushed
	ResultDuplicate               // the slot was already pushed: a no-op
	ResultStale                   // refused: a newer leader raised the fence
)

func (r Result) String() string {
	switch r {
	case ResultOK:
		return "ok"
	case ResultDuplicate:
		return "duplicate"
	case ResultStale:
		return "stale"
	}
	return "error"
}

// ErrStale means a leader with a larger fencing token has published: this
// replica is no longer the leader and must stop.
var ErrStale = errors.New("publisher: stale fencing token")

// publishScript is the whole publish of a batch of fires, atomic in
// Redis:
//  1. compare the token with the fence: lower is stale (the whole batch
//     is refused), higher raises it;
//  2. SADD each distinct Kombu binding of the batch, so a restored
//     message is never dropped;
//  3. for each fire, SET its dedup key NX with a TTL: taken means a
//     duplicate, and nothing else happens for that fire;
//  4. LPUSH the message;
//  5. record the run: LPUSH it on the entry's history list and count it,
//     so status shows the last runs after any failover without a byte of
//     history in etcd. The list is trimmed to the history length once it
//     holds twice that, which keeps trimming off the per-fire path.
//
// One script call carries up to scriptBatch fires: the per-call cost in
// Redis and in the client is paid once per batch, not per fire, and so is
// the binding.
//
// A fire whose LPUSH fails (the queue key holds another type) gets its
// dedup key back out and the result -2: it stays pending, is retried, and
// does not hold up the rest of the batch. A script aborted half-way would
// leave the dedup key of a message never pushed, and the retry would then
// count it a duplicate: a lost slot. Binding and history are best effort
// for the same reason: they must not lose the message.
//
// KEYS: fence, counts, then per fire: dedup, queue, history; then the
// distinct bindings. ARGV: token, ttl ms, history length, number of
// fires, then per fire: message, run record, entry; then the bindings'
// members. Returns one result per fire: 1 pushed, 0 duplicate, -1 stale,
// -2 failed.
var publishScript = redis.NewScript(`
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
local n = tonumber(ARGV[4])
local out = {}
if token < fence then
  for i = 1, n do out[i] = -1 end
  return out
end
if token > fence then redis.call('SET', KEYS[1], ARGV[1]) end
for b = 3 + 3 * n, #KEYS do
  redis.pcall('SADD', KEYS[b], ARGV[2 + b])
end
local keep = tonumber(ARGV[3])
for i = 1, n do
  local k, a = 3 * i, 2 + 3 * i
  if redis.call('SET', KEYS[k], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local pushed = redis.pcall('LPUSH', KEYS[k + 1], ARGV[a])
    if type(pushed) == 'table' and pushed.err then
      redis.call('DEL', KEYS[k])
      out[i] = -2
    else
      if keep > 0 then
        local len = redis.pcall('LPUSH', KEYS[k + 2], ARGV[a + 1])
        if type(len) == 'number' and len > 2 * keep then
          redis.pcall('LTRIM', KEYS[k + 2], 0, keep - 1)
        end
        redis.pcall('HINCRBY', KEYS[2], ARGV[a + 2], 1)
      end
      out[i] = 1
    end
  else
    out[i] = 0
  end
end
return out
`)

// scriptBatch is the most fires one script call carries. Larger batches
// hold Redis (single-threaded) for longer per call; 64 already makes the
// per-call overhead small next to the per-fire work.
const scriptBatch = 64

// fenceScript raises the fence to token and returns the fence's value.
var fenceScript = redis.NewScript(`
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > fence then redis.call('SET', KEYS[1], ARGV[1]) return token end
return fence
`)

// Options configure a Publisher.
type Options struct {
	// Cluster namespaces task ids: UUIDv5 of "<Cluster>/<entry>/<slot>".
	Cluster string
	// KeyPrefix prefixes beatd's own keys (the fence and dedup keys). Put
	// a hash tag in it, e.g. "beatd:{default}:", and the same tag in
	// Kombu's global_keyprefix, and Redis Cluster can run the script.
	KeyPrefix string
	// DedupTTL is how long a slot's dedup key lives; at least as long as
	// the longest catch-up window.
	DedupTTL time.Duration
	// Now reads the clock; a relative expiry counts from it.
	Now func() time.Time
	// History is how many runs each entry keeps in Redis for status
	// (default DefaultHistory; negative keeps none).
	History int
	// MinReplicas makes every publish wait (WAIT) until that many replicas
	// hold it; a shortfall leaves the batch's fires pending (replicas.go).
	// ReplicasAuto waits for one whenever the master has one. 0: no wait.
	MinReplicas        int
	MinReplicasTimeout time.Duration      // WAIT's timeout; DefaultReplicasTimeout when 0
	ReplicaShortfalls  prometheus.Counter // counts batches WAIT failed; may be nil
}

// DefaultHistory is the runs each entry keeps.
const DefaultHistory = 20

// DefaultDedupTTL is the dedup key lifetime unless a longer catch-up window
// needs more.
const DefaultDedupTTL = 7 * 24 * time.Hour

// Publisher pushes fires into Redis, fenced and deduplicated.
type Publisher struct {
	rdb      redis.UniversalClient
	fenceKey string
	prefix   string
	ttlArg   string
	keepArg  string
	keep     int
	now      func() time.Time
	bufs     sync.Pool
	repl     *replication
}

// New returns a Publisher on rdb.
func New(rdb redis.UniversalClient, opts Options) *Publisher {
	if opts.DedupTTL <= 0 {
		opts.DedupTTL = DefaultDedupTTL
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.History == 0 {
		opts.History = DefaultHistory
	}
	opts.History = max(opts.History, 0)
	return &Publisher{
		rdb:      rdb,
		fenceKey: opts.KeyPrefix + "fence",
		prefix:   opts.KeyPrefix,
		ttlArg:   strconv.FormatInt(opts.DedupTTL.Milliseconds(), 10),
		keepArg:  strconv.Itoa(opts.History),
		keep:     opts.History,
		now:      opts.Now,
		bufs:     sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }},
		repl:     newReplication(opts),
	}
}

// DedupKey is the key that marks (entry, slot) as pushed.
func (p *Publisher) DedupKey(id [36]byte) string { return p.prefix + "dedup:" + string(id[:]) }

// RaiseFence raises the Redis fence to token. A new leader calls it before
// it publishes anything, so a deposed leader is refused from then on. It
// returns ErrStale if a larger token already holds the fence.
func (p *Publisher) RaiseFence(ctx context.Context, token int64) error {
	v, err := fenceScript.Run(ctx, p.rdb, []string{p.fenceKey}, token).Int64()
	if err != nil {
		return fmt.Errorf("publisher: raise fence: %w", err)
	}
	if v > token {
		return fmt.Errorf("%w: fence is %d, token %d", ErrStale, v, token)
	}
	// A fence lost in a failover would let a deposed leader publish again.
	if err := p.repl.sync(ctx, p.rdb, strconv.FormatInt(token, 10)); err != nil {
		p.repl.failed()
		return fmt.Errorf("publisher: raise fence: %w", err)
	}
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

// Publish pushes every fire in one pipelined round trip and stores each
// outcome in results (len(results) must equal len(fires)). A non-nil error
// means some fires may not have been attempted; their result is
// ResultError and retrying them is safe, since the dedup key makes a
// repeat a no-op.
func (p *Publisher) Publish(ctx context.Context, token int64, fires []Fire, results []Result) error {
	if len(fires) == 0 {
		return nil
	}
	now := p.now()
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	buf := (*bp)[:0]
	// Each fire takes two consecutive spans of buf: its message, then its
	// run record.
	ends := make([]int, 2*len(fires))
	for i := range fires {
		buf = fires[i].Task.AppendMessage(buf, &fires[i], token, now)
		ends[2*i] = len(buf)
		buf = appendRun(buf, &fires[i], token, now)
		ends[2*i+1] = len(buf)
	}
	*bp = buf
	err := p.run(ctx, token, fires, buf, ends, results)
	if err != nil && isNoScript(err) {
		// The script cache was flushed (a restart or SCRIPT FLUSH): load it
		// and try once more. Anything already pushed dedups.
		if lerr := publishScript.Load(ctx, p.rdb).Err(); lerr != nil {
			return fmt.Errorf("publisher: load script: %w", lerr)
		}
		err = p.run(ctx, token, fires, buf, ends, results)
	}
	if err != nil {
		p.repl.failed()
		return fmt.Errorf("publisher: publish %d fires: %w", len(fires), err)
	}
	for _, r := range results {
		if r == ResultStale {
			return ErrStale
		}
	}
	return nil
}

func (p *Publisher) run(ctx context.Context, token int64, fires []Fire, buf []byte, ends []int, results []Result) error {
	pipe := p.rdb.Pipeline()
	ncalls := (len(fires) + scriptBatch - 1) / scriptBatch
	cmds := make([]*redis.Cmd, ncalls)
	tok := strconv.FormatInt(token, 10)
	counts := p.countsKey()
	want := p.repl.target(ctx, p.rdb)
	start := 0
	type binding struct{ key, member string }
	for c := range ncalls {
		batch := fires[c*scriptBatch : min((c+1)*scriptBatch, len(fires))]
		keys := make([]string, 0, 3+3*len(batch))
		args := make([]any, 0, 5+3*len(batch))
		keys = append(keys, p.fenceKey, counts)
		args = append(args, tok, p.ttlArg, p.keepArg, len(batch))
		var bindings []binding
		for j := range batch {
			i := c*scriptBatch + j
			t := fires[i].Task
			msg, run := buf[start:ends[2*i]], buf[ends[2*i]:ends[2*i+1]]
			start = ends[2*i+1]
			keys = append(keys, p.DedupKey(fires[i].ID), t.QueueKey, p.historyKey(t.Name))
			args = append(args, msg, run, t.Name)
			if b := (binding{t.BindingKey, t.BindingMember}); !slices.Contains(bindings, b) {
				bindings = append(bindings, b)
			}
		}
		for _, b := range bindings {
			keys = append(keys, b.key)
			args = append(args, b.member)
		}
		cmds[c] = publishScript.EvalSha(ctx, pipe, keys, args...)
	}
	wait := p.repl.queue(ctx, pipe, want, tok)
	_, err := pipe.Exec(ctx)
	var first error
	for c, cmd := range cmds {
		lo, hi := c*scriptBatch, min((c+1)*scriptBatch, len(fires))
		vals, cerr := cmd.Int64Slice()
		if cerr == nil && len(vals) != hi-lo {
			cerr = fmt.Errorf("publish script returned %d results for %d fires", len(vals), hi-lo)
		}
		for i := lo; i < hi; i++ {
			switch {
			case cerr != nil:
				results[i] = ResultError
			case vals[i-lo] == 1:
				results[i] = ResultOK
			case vals[i-lo] == 0:
				results[i] = ResultDuplicate
			case vals[i-lo] == -2:
				results[i] = ResultError
				if first == nil {
					first = fmt.Errorf("entry %q: LPUSH to %s failed (does the key hold another type?)", fires[i].Task.Name, fires[i].Task.QueueKey)
				}
			default:
				results[i] = ResultStale
			}
		}
		if cerr != nil && first == nil {
			first = cerr
		}
	}
	if werr := p.repl.check(wait, want, results); werr != nil && first == nil {
		first = werr
	}
	// Exec's error says why when the connection itself failed (a refused
	// AUTH leaves every reply empty, and its command's error reads only
	// "unexpected type=<nil>"); otherwise it is the first command's.
	if err != nil {
		return err
	}
	return first
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
