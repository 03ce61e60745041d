package console

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/internal/etcdscan"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cluster mirrors the cluster's etcd state for the console: every entry's
// stored state, kept current by a watch on the prefix, and a change signal
// for the live views. It loads once on first use and then applies the
// watch's events, so a page never reads 100k keys.
type cluster struct {
	clock  clockwork.Clock // the mirror's retries and the nudges wait on it
	cli    *clientv3.Client
	prefix string

	mu     sync.Mutex
	states map[string]*store.EntryState
	// byBucket holds the entries each state bucket (by key suffix) held
	// when last read, which states points into: a bucket is rewritten
	// whole, so its old entries must be dropped. An entry is dropped with
	// a bucket only when states still points into that bucket: while the
	// table moves to another layout an entry is in two keys, and the old
	// one's deletion must not drop it. (A map of each entry's bucket did
	// this at ~50 MB a million.)
	byBucket map[string][]store.EntryState
	gen      uint64 // bumped when an entry's paused flag may have changed
	loaded   chan struct{}
	loadErr  error
	changed  chan struct{} // closed and replaced on any change under the prefix
	leader   leaderSeen
	demand   chan struct{}
	once     sync.Once
	nudged   atomic.Bool
}

// leaderSeen is when this replica first saw a leader token.
type leaderSeen struct {
	token int64
	at    time.Time
}

func newCluster(cli *clientv3.Client, prefix string, clock clockwork.Clock) *cluster {
	return &cluster{cli: cli, prefix: prefix, states: map[string]*store.EntryState{}, byBucket: map[string][]store.EntryState{}, loaded: make(chan struct{}),
		changed: make(chan struct{}), demand: make(chan struct{}), clock: clock}
}

// want asks run to start mirroring (the first page view does).
func (c *cluster) want() { c.once.Do(func() { close(c.demand) }) }

// ready waits until the first load, or ctx ends.
func (c *cluster) ready(ctx context.Context) error {
	c.want()
	select {
	case <-c.loaded:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.loadErr
	case <-ctx.Done():
		return fmt.Errorf("console: etcd state not loaded yet: %w", ctx.Err())
	}
}

// changes returns a channel closed at the next change.
func (c *cluster) changes() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// nudge notifies within nudgeAfter, once for any number of calls in
// between: the leader's fires call it, at any rate.
func (c *cluster) nudge() {
	if c.nudged.CompareAndSwap(false, true) {
		c.clock.AfterFunc(nudgeAfter, func() {
			c.nudged.Store(false)
			c.notify()
		})
	}
}

const nudgeAfter = 100 * time.Millisecond

func (c *cluster) notify() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// run mirrors the prefix until ctx ends, once someone asked for it. It
// reloads after a watch failure (compaction, a lost etcd).
func (c *cluster) run(ctx context.Context) {
	select {
	case <-c.demand:
	case <-ctx.Done():
		return
	}
	first := true
	b := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		rev, err := c.load(ctx)
		if first {
			c.mu.Lock()
			c.loadErr = err
			c.mu.Unlock()
			close(c.loaded)
			first = false
		}
		if err == nil {
			b.Reset()
			c.notify()
			c.watch(ctx, rev)
		}
		if !retry.Sleep(ctx, c.clock, b.NextBackOff()) {
			return
		}
	}
}

func (c *cluster) load(ctx context.Context) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	states := map[string]*store.EntryState{}
	byBucket := map[string][]store.EntryState{}
	add := func(kv *mvccpb.KeyValue) {
		b, recs := c.decodeBucket(kv.Key, kv.Value)
		if b == "" {
			return
		}
		for i := range recs {
			states[recs[i].Name] = &recs[i]
		}
		byBucket[b] = recs
	}
	rev, err := etcdscan.Prefix(lctx, c.cli, keys.State(c.prefix), store.StatePage, add)
	if err != nil {
		return 0, fmt.Errorf("console: load entry state: %w", err)
	}
	// A sharded cluster's state is in each shard's table: each is read
	// alone, not all of keys.Shards, which also holds every runtime
	// entry's definition. The watch starts after the first read's
	// revision, so a bucket rewritten between the reads is applied again,
	// whole, which changes nothing.
	n, _, err := reshard.ReadCount(lctx, c.cli, c.prefix)
	if err != nil {
		return 0, fmt.Errorf("console: %w", err)
	}
	for i := range n {
		if n == 1 {
			break // one shard's table is the cluster's, read above
		}
		if _, err := etcdscan.Prefix(lctx, c.cli, keys.State(keys.Shard(c.prefix, i, n)), store.StatePage, add); err != nil {
			return 0, fmt.Errorf("console: load shard %d's entry state: %w", i, err)
		}
	}
	c.mu.Lock()
	c.states, c.byBucket = states, byBucket
	c.gen++
	c.loadErr = nil
	c.mu.Unlock()
	return rev, nil
}

// setBucket replaces bucket b's entries with recs (none: the bucket was
// deleted); c.mu is held. A bucket is rewritten whole: its old entries
// go, its new ones come.
func (c *cluster) setBucket(b string, recs []store.EntryState) {
	old := make(map[string]bool, len(c.byBucket[b]))
	prev := c.byBucket[b]
	for i := range prev {
		n := prev[i].Name
		st := c.states[n]
		if st != &prev[i] {
			continue // since read from another bucket (a layout move)
		}
		old[n] = st.Paused
		delete(c.states, n)
	}
	for i := range recs {
		st := &recs[i]
		c.states[st.Name] = st
		// Fires rewrite state all the time; only a pause, a resume or a
		// new entry changes the entries table's order.
		if wasPaused, ok := old[st.Name]; !ok || wasPaused != st.Paused {
			c.gen++
		}
		delete(old, st.Name)
	}
	if len(recs) == 0 {
		delete(c.byBucket, b)
	} else {
		c.byBucket[b] = recs
	}
	for _, wasPaused := range old {
		if wasPaused {
			c.gen++
		}
	}
}

// decodeBucket returns a state bucket's name and entries; "" for a key
// that is no state bucket, or a key or value this version cannot read
// (the scheduler reports those). A bucket of the cluster's table is named
// by its key suffix, one of shard i's table "i/" and its suffix.
func (c *cluster) decodeBucket(key, value []byte) (string, []store.EntryState) {
	b, ok := store.BucketAt(c.prefix, key)
	if !ok {
		b, ok = c.shardBucket(key)
	}
	if !ok {
		return "", nil
	}
	recs, err := store.DecodeBucket(value)
	if err != nil {
		return "", nil
	}
	return b, recs
}

// shardBucket is a key's bucket name when it is in a shard's state table
// (keys.Shard).
func (c *cluster) shardBucket(key []byte) (string, bool) {
	rest, ok := strings.CutPrefix(string(key), keys.Shards(c.prefix))
	if !ok {
		return "", false
	}
	i, _, ok := strings.Cut(rest, "/")
	if _, err := strconv.Atoi(i); !ok || err != nil {
		return "", false
	}
	b, ok := store.BucketAt(keys.Shards(c.prefix)+i+"/", key)
	return i + "/" + b, ok
}

func (c *cluster) watch(ctx context.Context, rev int64) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.cli.Watch(wctx, c.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return
		}
		c.mu.Lock()
		for _, ev := range resp.Events {
			var recs []store.EntryState
			var b string
			if ev.Type == clientv3.EventTypeDelete {
				b, _ = c.decodeBucket(ev.Kv.Key, nil)
			} else {
				b, recs = c.decodeBucket(ev.Kv.Key, ev.Kv.Value)
			}
			if b == "" {
				continue
			}
			c.setBucket(b, recs)
		}
		c.mu.Unlock()
		c.notify()
	}
}

// state returns a copy of an entry's stored state, or nil.
func (c *cluster) state(name string) *store.EntryState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.states[name]; st != nil {
		cp := *st
		return &cp
	}
	return nil
}

// states returns, under one lock, every entry's stored state with the
// generation it reflects. The records are shared, not copied: the mirror
// replaces a record when its bucket changes and never writes one in place.
func (c *cluster) statesSnapshot() (map[string]*store.EntryState, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]*store.EntryState, len(c.states))
	for n, st := range c.states {
		out[n] = st
	}
	return out, c.gen
}

// failure is one run that failed on a worker, or was lost.
type failure struct {
	Entry     string
	At        time.Time
	Outcome   string
	Exception string
}

// recentFailures returns the runs that failed or were lost since since,
// newest first, at most limit of them, and how many there were. Each
// entry's state keeps its last few runs, so this is what those show.
func (c *cluster) recentFailures(since time.Time, limit int) (n int, out []failure) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, st := range c.states {
		if st.Out == nil || st.Out.LastFailure.Before(since) {
			continue
		}
		for _, r := range st.Out.Runs {
			if (r.Kind == outcome.Failed || r.Kind == outcome.Lost) && !r.Updated.Before(since) {
				n++
				exc := r.ExcType
				if r.ExcMsg != "" {
					exc += ": " + r.ExcMsg
				}
				out = append(out, failure{Entry: name, At: r.Updated, Outcome: r.Kind.String(), Exception: exc})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.After(out[j].At) })
	if len(out) > limit {
		out = out[:limit]
	}
	return n, out
}

func (c *cluster) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// lastSlot is the persisted last slot of an entry (for the backlog).
func (c *cluster) lastSlot(name string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.states[name]; st != nil {
		return st.LastSlot
	}
	return time.Time{}
}

// seenLeader records when a token was first seen and returns that time.
func (c *cluster) seenLeader(token int64, now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader.token != token {
		c.leader = leaderSeen{token: token, at: now}
	}
	return c.leader.at
}
