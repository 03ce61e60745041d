package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/leader"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/status"
	"github.com/jonboulle/clockwork"

	"github.com/beatd/beatd/api"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// backend answers the HTTP API for a replica (api.Backend): liveness,
// readiness, status and admin requests. It holds only what answering
// needs, so the API reads the replica without reaching into Main's wiring.
type backend struct {
	id        string
	clock     clockwork.Clock
	ctx       context.Context // the replica's run: status refreshes outlive a request, not the replica
	etcd      *clientv3.Client
	prefix    string
	endpoints string // for messages that say which etcd did not answer
	store     *store.Store
	leader    *leader.Loop
	sched     *scheduler.Scheduler
	// config is the config the replica runs (Main.runningConfig).
	config func() *config.Config
	// entry is an entry's definition wherever it runs (Main.entryOf).
	entry func(ctx context.Context, name string) (*config.Entry, error)
	// remote, on a sharded replica, is a page's runtime entries of the
	// shards it does not lead, and how many follow (Main.remoteEntries).
	remote   func(ctx context.Context, after, prefix string, limit int) ([]*config.Entry, int, error)
	pub      *redisbroker.Publisher // nil on AMQP, which keeps no run history
	ping     func(context.Context) error
	merger   *sources.Merger
	metrics  *scheduler.Metrics
	feed     *outcome.Feed
	outcomes outcomeFlags
	started  time.Time
	status   statusCache
	clockOff *clockOffset
	// conflicts, on a sharded replica, is every conflict it knows of
	// (Main.conflicts); nil: the merger's.
	conflicts func() []sources.Conflict
	// shards is a sharded replica's leadership (nil: one shard, whose
	// leader and sched are the replica's).
	shards *shardSet
	// peers reads the other replicas' HTTP (the shard leaders' live
	// fields), trusting --http-tls-ca.
	peers *http.Client
}

// statusCache is the last status read from etcd, so GET /status answers
// within statusBudget while etcd is slow or down.
type statusCache struct {
	mu         sync.Mutex
	last       *api.Status // the last status read from etcd
	lastAt     time.Time
	lastErr    error         // of the last read from etcd; nil once one succeeds
	refreshing chan struct{} // closed when the refresh in flight ends
	wg         sync.WaitGroup
}

// Alive implements api.Backend.
func (b *backend) Alive() error {
	if b.shards != nil {
		if i, stopped := b.shards.stopped(); stopped {
			return fmt.Errorf("shard %d's leadership loop stopped", i)
		}
		return nil
	}
	if b.leader.Stopped() {
		return errors.New("leadership loop stopped")
	}
	return nil
}

// Ready implements api.Backend: etcd and the broker answer, and the
// leader can publish.
func (b *backend) Ready(ctx context.Context) error {
	if _, err := b.etcd.Get(ctx, keys.Leaders(b.prefix), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		b.metrics.EtcdErrors.Inc()
		return fmt.Errorf("etcd unreachable: %w", err)
	}
	if err := b.ping(ctx); err != nil {
		b.metrics.RedisErrors.Inc()
		return fmt.Errorf("broker unreachable: %w", err)
	}
	if err := b.merger.Err(); err != nil {
		return err
	}
	if b.shards != nil {
		return b.shards.termErr(b.clock.Now())
	}
	if b.leader.Token() != 0 {
		return termErr(b.sched, b.pub, b.clock.Now())
	}
	return nil
}

// termErr is why a term's scheduler cannot do its work (nil: it can):
// its publishes or state writes fail, an entry fires behind or runs
// away, or the broker does not hold its publishes on enough replicas.
// pub is the term's Redis publisher (nil on other brokers).
func termErr(sched *scheduler.Scheduler, pub *redisbroker.Publisher, now time.Time) error {
	if err := sched.PublishError(); err != nil {
		return fmt.Errorf("leader cannot publish: %w", err)
	}
	if err := sched.PersistError(); err != nil {
		return fmt.Errorf("leader cannot persist state to etcd (still firing): %w", err)
	}
	if err := sched.Health(now); err != nil {
		return err
	}
	if pub != nil {
		if err := pub.ReplicationError(); err != nil {
			return fmt.Errorf("leader cannot publish: %w", err)
		}
	}
	return nil
}

// Status implements api.Backend, from etcd, so standbys serve it too. It
// answers within a second even when etcd does not, from what it last knew.
func (b *backend) Status(ctx context.Context, q api.StatusQuery) (api.Status, error) {
	var (
		st  api.Status
		err error
	)
	if q.Default() {
		st, err = b.cachedStatus(ctx)
	} else {
		// Another page: read for this request, not cached.
		if st, err = b.fromEtcd(ctx, q); err != nil {
			return st, err
		}
	}
	st.ID = b.id
	conflicts := b.merger.Conflicts
	if b.conflicts != nil {
		conflicts = b.conflicts
	}
	st.Sources, st.Conflicts = b.merger.Health(), conflicts()
	st.Leader = st.LeaderID == b.id && st.FencingToken != 0 && b.leader.Token() == st.FencingToken
	if b.shards != nil {
		// A sharded replica leads the shards whose term it holds, as
		// etcd says: the ones it and etcd agree on.
		st.Shards = slices.Clone(st.Shards) // the cache's are shared
		led := b.shards.leading()
		for i := range st.Shards {
			sh := &st.Shards[i]
			sh.Leader = sh.LeaderID == b.id && sh.FencingToken != 0 &&
				slices.ContainsFunc(led, func(l shardLead) bool { return l.Shard == sh.Shard && l.Token == sh.FencingToken })
			st.Leader = st.Leader || sh.Leader
		}
		b.overlayShardsLive(ctx, &st, q)
	} else {
		st.Overlay(b.liveResults())
	}
	if b.clockOff != nil {
		cs := b.clockOff.status()
		st.ClockOffsetSeconds, st.ClockOffsetUncertaintySeconds, st.ClockWarning = cs.OffsetSeconds, cs.UncertaintySeconds, cs.Warning
	}
	if b.feed != nil {
		st.OutcomeWarning = outcomeWarning(b.feed, b.outcomes, b.started, b.clock.Now())
	}
	return st, err
}

// fromEtcd is the status page q from etcd (status.FromEtcd). On a
// sharded replica the config it runs lacks the runtime entries of the
// shards it does not lead: the page is built from a config of the first
// q.Limit+1 entries of both that follow q.After, so it is the page the
// whole cluster's config would give, and its total is counted apart.
func (b *backend) fromEtcd(ctx context.Context, q api.StatusQuery) (api.Status, error) {
	cfg := b.config()
	if b.remote == nil {
		return status.FromEtcd(ctx, b.etcd, b.prefix, cfg, b.history(), b.clock.Now(), q)
	}
	remote, total, err := b.remote(ctx, q.After, q.Prefix, q.Limit)
	if err != nil {
		return api.Status{}, err
	}
	var list []*config.Entry
	for e := range cfg.Following(q.After, q.Prefix) {
		if total++; len(list) <= q.Limit {
			list = append(list, e)
		}
	}
	list = append(list, remote...)
	slices.SortFunc(list, func(a, b *config.Entry) int { return strings.Compare(a.Name, b.Name) })
	page := cfg.WithEntries(list)
	st, err := status.FromEtcd(ctx, b.etcd, b.prefix, page, b.history(), b.clock.Now(), q)
	if err == nil && !(q.Prefix == "" && q.After == "" && len(list) <= q.Limit) {
		// Not the whole cluster in one page: Build counted the page's
		// config only.
		st.EntriesTotal = total
	}
	return st, err
}

// statusBudget is how long GET /status waits for etcd before answering
// from the last status it read, flagged stale.
const statusBudget = 500 * time.Millisecond

// cachedStatus answers from etcd if etcd answers within statusBudget,
// else from the last status read, marked stale with its age. The read
// goes on in the background and refreshes the cache when it ends.
func (b *backend) cachedStatus(ctx context.Context) (api.Status, error) {
	o := &b.status
	o.mu.Lock()
	wait := o.refreshing
	if wait == nil {
		wait = make(chan struct{})
		o.refreshing = wait
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			rctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
			st, err := b.fromEtcd(rctx, api.StatusQuery{Limit: api.DefaultStatusLimit})
			cancel()
			o.mu.Lock()
			o.lastErr = err
			if err == nil {
				o.last, o.lastAt = &st, b.clock.Now()
			} else {
				b.metrics.EtcdErrors.Inc()
			}
			o.refreshing = nil
			o.mu.Unlock()
			close(wait)
		}()
	}
	o.mu.Unlock()
	budget := statusBudget
	t := b.clock.NewTimer(budget)
	defer t.Stop()
	select {
	case <-wait:
	case <-t.Chan():
	case <-ctx.Done():
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var st api.Status
	if o.last != nil {
		st = *o.last
		st.Entries = append([]api.EntryStatus(nil), st.Entries...)
	} else {
		// Nothing read yet: what the config says, with no state.
		st = status.FromConfig(b.config(), b.clock.Now())
	}
	switch {
	case !isClosed(wait):
		st.Error = fmt.Sprintf("etcd at %s did not answer within %s; this is what the replica last knew", b.endpoints, budget)
	case o.lastErr != nil:
		st.Error = fmt.Sprintf("etcd at %s: %v; this is what the replica last knew", b.endpoints, o.lastErr)
	}
	if st.Error != "" {
		st.Stale = true
		if o.last != nil {
			st.StaleSeconds = roundSeconds(b.clock.Since(o.lastAt))
		}
	}
	return st, nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func roundSeconds(d time.Duration) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(d.Seconds(), 'f', 1, 64), 64)
	return v
}

// liveResults is what an unsharded replica's loop remembers of each
// entry's last publish (only a leader, or a replica that led, has any),
// for status's overlay; a sharded one's are gathered from every shard's
// leader (overlayShardsLive).
func (b *backend) liveResults() map[string]status.Live {
	results := b.metrics.Results()
	out := make(map[string]status.Live, len(results))
	for name, r := range results {
		out[name] = liveOf(r)
	}
	return out
}

// history is the run history for status, or nil with a broker that keeps
// none (RabbitMQ).
func (b *backend) history() outcome.History {
	if b.pub == nil {
		return nil
	}
	return b.pub
}
