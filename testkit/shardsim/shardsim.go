// Package shardsim simulates the sharding that docs/shards.md describes
// past one leader, with beatd's own parts: entries split into N shards by
// a stable hash of the name, each shard with its own etcd election, fence,
// state table and broker fence, run by the scheduler and the Redis
// publisher that beatd runs; replicas each lead a share of the shards.
// It is a model for measuring the design, not a beatd feature.
package shardsim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/leader"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ShardOf is the shard of an entry: FNV-1a of its name, as the state
// table picks buckets, so every replica agrees without a table.
func ShardOf(name string, shards int) int { return keys.ShardOf(name, shards) }

// Cluster is what the replicas share.
type Cluster struct {
	Etcd     []string
	Redis    string // host:port
	Prefix   string // etcd prefix, e.g. /beatd/sim/
	Shards   int
	TTL      time.Duration
	Config   *config.Config
	Logger   *slog.Logger
	Interval time.Duration // how often a replica balances its share (default 200 ms)
}

// Replica is one process of the simulation: a leader loop per shard,
// which campaigns only while the replica holds less than its share.
type Replica struct {
	ID     string
	c      *Cluster
	cli    *clientv3.Client
	rdb    *goredis.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// live is the registered replicas as balance last read them (0: not
	// read yet, which counts as this replica alone).
	live atomic.Int64

	mu   sync.Mutex
	held map[int]func(context.Context) error // shard -> resign its term
}

func (c *Cluster) shardPrefix(i int) string { return fmt.Sprintf("%sshards/%d/", c.Prefix, i) }

// Start starts replica id.
func (c *Cluster) Start(id string) (*Replica, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Interval == 0 {
		c.Interval = 200 * time.Millisecond
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Etcd, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	r := &Replica{ID: id, c: c, cli: cli, rdb: goredis.NewClient(&goredis.Options{Addr: c.Redis}), held: map[int]func(context.Context) error{}}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	log := c.Logger.With("replica", id)
	// Membership is beatd's registry: a registration on its own lease,
	// gone a TTL after the replica dies, and made again when a loaded
	// etcd let it lapse (a one-off key on a session would stay gone, and
	// the others' share would stay too high for good).
	r.wg.Go(func() {
		election.Register(ctx, election.RegistryConfig{Client: cli, Prefix: c.Prefix, TTL: c.TTL, Logger: log}, election.Replica{ID: id})
	})
	for i := range c.Shards {
		var mine []*config.Entry
		for _, e := range c.Config.Entries {
			if ShardOf(e.Name, c.Shards) == i {
				mine = append(mine, e)
			}
		}
		pub := redis.New(r.rdb, redis.Options{Cluster: "sim", KeyPrefix: fmt.Sprintf("beatd:{sim}:s%d:", i)})
		sched, err := scheduler.New(scheduler.Config{Dispatcher: pub, Store: store.New(cli, c.shardPrefix(i)), Logger: log.With("shard", i),
			Cluster: "sim", Origin: "beatd@" + id, StateInterval: 200 * time.Millisecond}, c.Config.WithEntries(mine))
		if err != nil {
			cancel()
			return nil, err
		}
		el, err := election.New(election.Config{Client: cli, Prefix: c.shardPrefix(i), ID: id, TTL: c.TTL, Logger: log})
		if err != nil {
			cancel()
			return nil, err
		}
		loop, err := leader.New(leader.Config{Elector: leader.Etcd(el), Hold: r.hold, Logger: log.With("shard", i),
			Lead: func(ctx context.Context, t leader.Term) error {
				r.mu.Lock()
				r.held[i] = t.Resign
				r.mu.Unlock()
				defer func() {
					r.mu.Lock()
					delete(r.held, i)
					r.mu.Unlock()
				}()
				return sched.Run(ctx, t.Term)
			}})
		if err != nil {
			cancel()
			return nil, err
		}
		r.wg.Go(func() { loop.Run(ctx) })
	}
	r.wg.Go(func() { r.balance(ctx) })
	return r, nil
}

// share is how many shards this replica may lead: the shards over the
// live members as last read, rounded up.
func (r *Replica) share() int {
	live := max(int(r.live.Load()), 1)
	return (r.c.Shards + live - 1) / live
}

// readLive counts the registered replicas. A failed read keeps the last
// count, as beatd's shardSet does: taking a slow etcd (a read past its
// timeout on loaded cores) for "I am alone" made every replica's share
// all the shards at once, so none handed one over and all campaigned.
func (r *Replica) readLive(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := r.cli.Get(ctx, keys.Replicas(r.c.Prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err == nil && resp.Count > 0 {
		r.live.Store(resp.Count)
	}
}

// hold keeps a replica at its share out of the other shards' elections.
func (r *Replica) hold() time.Duration {
	if r.Held() >= r.share() {
		return r.c.Interval
	}
	return 0
}

// balance resigns shards above the share, one at a time, so a replica
// that joins (or the first to start) ends up with its share.
func (r *Replica) balance(ctx context.Context) {
	t := time.NewTicker(r.c.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.readLive(ctx)
		share := r.share()
		r.mu.Lock()
		var resign func(context.Context) error
		if len(r.held) > share {
			top := -1
			for i := range r.held {
				top = max(top, i)
			}
			resign = r.held[top]
		}
		r.mu.Unlock()
		if resign != nil {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = resign(rctx)
			cancel()
		}
	}
}

// Held is how many shards the replica leads now.
func (r *Replica) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// Kill stops the replica as kill -9 does: its connections drop first, so
// nothing more reaches etcd or Redis, and nothing is resigned: its leases
// expire after the TTL.
func (r *Replica) Kill() {
	_ = r.rdb.Close()
	_ = r.cli.Close()
	r.cancel()
	r.wg.Wait()
}

// Stop stops the replica gracefully: every term finishes and resigns.
func (r *Replica) Stop() {
	r.cancel()
	r.wg.Wait()
	_ = r.rdb.Close()
	_ = r.cli.Close()
}
