package console

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cluster mirrors the cluster's etcd state for the console: every entry's
// stored state, kept current by a watch on the prefix, and a change signal
// for the live views. It loads once on first use and then applies the
// watch's events, so a page never reads 100k keys.
type cluster struct {
	cli    *clientv3.Client
	prefix string

	mu      sync.Mutex
	states  map[string]*store.EntryState
	gen     uint64 // bumped when an entry's paused flag may have changed
	loaded  chan struct{}
	loadErr error
	changed chan struct{} // closed and replaced on any change under the prefix
	leader  leaderSeen
	demand  chan struct{}
	once    sync.Once
	nudged  atomic.Bool
}

// leaderSeen is when this replica first saw a leader token.
type leaderSeen struct {
	token int64
	at    time.Time
}

func newCluster(cli *clientv3.Client, prefix string) *cluster {
	return &cluster{cli: cli, prefix: prefix, states: map[string]*store.EntryState{}, loaded: make(chan struct{}),
		changed: make(chan struct{}), demand: make(chan struct{})}
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
		time.AfterFunc(nudgeAfter, func() {
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
	backoff := 100 * time.Millisecond
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
			backoff = 100 * time.Millisecond
			c.notify()
			c.watch(ctx, rev)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (c *cluster) load(ctx context.Context) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.cli.Get(lctx, c.prefix+"entries/", clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("console: load entry state: %w", err)
	}
	states := make(map[string]*store.EntryState, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if st := decodeState(c.prefix, kv.Key, kv.Value); st != nil {
			states[st.Name] = st
		}
	}
	c.mu.Lock()
	c.states = states
	c.gen++
	c.loadErr = nil
	c.mu.Unlock()
	return resp.Header.Revision, nil
}

func decodeState(prefix string, key, value []byte) *store.EntryState {
	var st store.EntryState
	if json.Unmarshal(value, &st) != nil {
		return nil // not readable by this version; the scheduler reports it
	}
	st.Name = strings.TrimPrefix(string(key), prefix+"entries/")
	st.Recent = nil // read per page through Runs, not kept for every entry
	return &st
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
			key := string(ev.Kv.Key)
			if !strings.HasPrefix(key, c.prefix+"entries/") {
				continue
			}
			name := strings.TrimPrefix(key, c.prefix+"entries/")
			old := c.states[name]
			if ev.Type == clientv3.EventTypeDelete {
				delete(c.states, name)
				if old != nil && old.Paused {
					c.gen++
				}
			} else if st := decodeState(c.prefix, ev.Kv.Key, ev.Kv.Value); st != nil {
				c.states[name] = st
				// Fires rewrite state all the time; only a pause or a
				// resume changes the order of the entries table.
				if old == nil || old.Paused != st.Paused {
					c.gen++
				}
			}
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

// paused reports, under one lock, which entries are paused, with the
// generation it reflects.
func (c *cluster) pausedSet() (map[string]bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]bool{}
	for n, st := range c.states {
		if st.Paused {
			out[n] = true
		}
	}
	return out, c.gen
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

// stateRuns is the Runs implementation that reads run history from the
// etcd entry state, for the rows asked for only: the mirror keeps no run
// history, so its memory stays small with many entries.
type stateRuns struct {
	cli    *clientv3.Client
	prefix string
}

func (r stateRuns) Recent(ctx context.Context, names []string) (map[string][]store.Run, error) {
	out := make(map[string][]store.Run, len(names))
	for len(names) > 0 {
		chunk := names[:min(len(names), store.MaxOpsPerTxn)]
		names = names[len(chunk):]
		ops := make([]clientv3.Op, len(chunk))
		for i, n := range chunk {
			ops[i] = clientv3.OpGet(r.prefix + "entries/" + n)
		}
		resp, err := r.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return out, fmt.Errorf("console: read run history: %w", err)
		}
		for i, rr := range resp.Responses {
			if kvs := rr.GetResponseRange().GetKvs(); len(kvs) > 0 {
				var st store.EntryState
				if json.Unmarshal(kvs[0].Value, &st) == nil {
					out[chunk[i]] = st.Recent
				}
			}
		}
	}
	return out, nil
}
