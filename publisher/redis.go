package publisher

import (
	"context"
	"errors"
	"fmt"
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

// publishScript is the whole publish, atomic in Redis:
//  1. compare the token with the fence: lower is stale, higher raises it;
//  2. SET the dedup key NX with a TTL: taken means a duplicate;
//  3. SADD the Kombu binding, so a restored message is never dropped;
//  4. LPUSH the message.
//
// KEYS: fence, dedup, binding, queue. ARGV: token, ttl ms, member, message.
var publishScript = redis.NewScript(`
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < fence then return -1 end
if token > fence then redis.call('SET', KEYS[1], ARGV[1]) end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('LPUSH', KEYS[4], ARGV[4])
return 1
`)

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
	// MinReplicas makes every publish wait (WAIT) until that many replicas
	// hold it; a shortfall leaves the batch's fires pending (replicas.go).
	// ReplicasAuto waits for one whenever the master has one. 0: no wait.
	MinReplicas        int
	MinReplicasTimeout time.Duration      // WAIT's timeout; DefaultReplicasTimeout when 0
	ReplicaShortfalls  prometheus.Counter // counts batches WAIT failed; may be nil
}

// DefaultDedupTTL is the dedup key lifetime unless a longer catch-up window
// needs more.
const DefaultDedupTTL = 7 * 24 * time.Hour

// Publisher pushes fires into Redis, fenced and deduplicated.
type Publisher struct {
	rdb      redis.UniversalClient
	fenceKey string
	prefix   string
	ttlArg   string
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
	return &Publisher{
		rdb:      rdb,
		fenceKey: opts.KeyPrefix + "fence",
		prefix:   opts.KeyPrefix,
		ttlArg:   strconv.FormatInt(opts.DedupTTL.Milliseconds(), 10),
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
	ends := make([]int, len(fires))
	for i := range fires {
		buf = fires[i].Task.AppendMessage(buf, &fires[i], token, now)
		ends[i] = len(buf)
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
	cmds := make([]*redis.Cmd, len(fires))
	tok := strconv.FormatInt(token, 10)
	want := p.repl.target(ctx, p.rdb)
	start := 0
	for i := range fires {
		t := fires[i].Task
		msg := buf[start:ends[i]]
		start = ends[i]
		cmds[i] = publishScript.EvalSha(ctx, pipe,
			[]string{p.fenceKey, p.DedupKey(fires[i].ID), t.BindingKey, t.QueueKey},
			tok, p.ttlArg, t.BindingMember, msg)
	}
	wait := p.repl.queue(ctx, pipe, want, tok)
	_, err := pipe.Exec(ctx)
	var first error
	for i, c := range cmds {
		v, cerr := c.Int64()
		switch {
		case cerr != nil:
			results[i] = ResultError
			if first == nil {
				first = cerr
			}
		case v == 1:
			results[i] = ResultOK
		case v == 0:
			results[i] = ResultDuplicate
		default:
			results[i] = ResultStale
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
