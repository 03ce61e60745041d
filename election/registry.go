package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/beatd/beatd/internal/keys"
	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Replica is what a running replica says about itself in etcd, so that any
// replica (or the web console on a standby) can list the cluster's members
// and their health without reaching them.
type Replica struct {
	ID      string    `json:"id"`
	HTTP    string    `json:"http"` // the base URL its HTTP server answers at (host:port from older releases)
	Started time.Time `json:"started"`
	Version string    `json:"version,omitempty"`
	// Health is "ok", or why the replica is not ready, as it last saw it.
	Health string `json:"health"`
	// Broker is "ok", or why this replica's own path to the broker
	// fails, as its last probe saw it: a leader cut from the broker
	// hands over to a replica that reaches it.
	Broker string `json:"broker,omitempty"`
	// Draining is set while the replica hands its shards over before it
	// exits: the others count it out of their shares.
	Draining bool `json:"draining,omitempty"`
	// Loading are the shards whose entries the replica is loading, or has
	// loaded, to campaign for them: the other replicas leave those to it
	// rather than load them too.
	Loading []int `json:"loading,omitempty"`
	// Busy is set while the replica reads a shard's entries, drops them,
	// or starts a term of one; Waiting while it holds a shard loaded for
	// a move not made yet. On a shared host each slowed the others' moves:
	// a move is made while no replica is busy, and a load ahead of a move
	// waits while one is busy or waiting (daemon's shardSet).
	Busy    bool      `json:"busy,omitempty"`
	Waiting bool      `json:"waiting,omitempty"`
	Updated time.Time `json:"updated"`
	// LeaderToken and LeaderSince are set while the replica leads: its
	// term's token and when it was elected.
	LeaderToken int64     `json:"leader_token,omitempty"`
	LeaderSince time.Time `json:"leader_since,omitzero"`
}

// RegistryConfig configures Register.
type RegistryConfig struct {
	Client *clientv3.Client
	Prefix string // the cluster's prefix; registrations live under keys.Replicas
	// TTL of the registration's lease: a replica that dies disappears this
	// long after its last refresh. Default DefaultTTL.
	TTL time.Duration
	// Every is how often health is re-checked and the registration
	// written if it changed (the lease is kept alive apart, by etcd's
	// client). Default TTL/3, at least 500ms.
	Every time.Duration
	// Health reports the replica's readiness; nil means always ok.
	Health func(ctx context.Context) error
	// Broker reports the replica's last broker probe (no I/O); nil: not
	// reported.
	Broker func() error
	// Leading returns this replica's term token and election time while
	// it leads, else 0; nil means never.
	Leading func() (token int64, since time.Time)
	// Draining says whether the replica is draining (Replica.Draining);
	// nil means never. A value on Poke writes the registration at once.
	Draining func() bool
	// Loading says which shards the replica loads (Replica.Loading); nil
	// means none. A change is written at the next value on Poke.
	Loading func() []int
	// Activity says whether the replica is busy and waiting
	// (Replica.Busy, Replica.Waiting); nil means neither. A change is
	// written at the next value on Poke.
	Activity func() (busy, waiting bool)
	Poke     <-chan struct{}
	Logger   *slog.Logger
	// Clock times the refreshes and stamps Updated; the real clock if nil.
	Clock clockwork.Clock
}

func replicaPrefix(prefix string) string { return keys.Replicas(prefix) }

// Register keeps r registered, with a fresh health report every cfg.Every,
// until ctx ends; then it revokes the registration's lease so the replica
// leaves the list at once. A registration lost to an etcd outage is made
// again when etcd answers. The registration uses its own lease, separate
// from the election's, so it never affects leadership.
func Register(ctx context.Context, cfg RegistryConfig, r Replica) {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Every <= 0 {
		cfg.Every = max(cfg.TTL/3, 500*time.Millisecond)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	log := cfg.Logger.With("component", "registry")
	key := replicaPrefix(cfg.Prefix) + r.ID
	ttl := max(int64((cfg.TTL+time.Second-1)/time.Second), 1)
	var lease clientv3.LeaseID
	// The lease is renewed by etcd's client on its own stream, apart
	// from the health checks and puts: renewing it in the same loop let
	// a slow health check and a slow etcd (900,000 entries on 2 cores)
	// space two renewals past the TTL, so a running replica's
	// registration lapsed, the others counted it dead and loaded its
	// shards, which slowed etcd further.
	var alive <-chan *clientv3.LeaseKeepAliveResponse
	stopAlive := func() {}
	defer func() {
		stopAlive()
		if lease != 0 {
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = cfg.Client.Revoke(rctx, lease)
			cancel()
		}
	}()
	tick := cfg.Clock.NewTicker(cfg.Every)
	defer tick.Stop()
	warned := false
	var w written
	for {
		err := refresh(ctx, cfg, key, ttl, &lease, &r, &w)
		if lease == 0 && alive != nil {
			stopAlive()
			stopAlive, alive = func() {}, nil
		}
		if err == nil && lease != 0 && alive == nil {
			kctx, cancel := context.WithCancel(ctx)
			if alive, err = cfg.Client.KeepAlive(kctx, lease); err != nil {
				cancel()
				alive, err = nil, fmt.Errorf("election: keep the registration alive: %w", err)
			} else {
				stopAlive = cancel
			}
		}
		if err != nil && ctx.Err() == nil && !warned {
			log.Warn("replica registration failed; retrying", "err", err)
			warned = true
		} else if err == nil {
			warned = false
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.Chan():
				break wait
			case <-cfg.Poke:
				break wait
			case _, ok := <-alive:
				if !ok {
					// Expired at etcd, or no renewal answered for a
					// TTL: register anew at once.
					log.Warn("replica registration's lease lapsed; registering again", "lease", fmt.Sprintf("%x", lease))
					stopAlive()
					stopAlive, alive, lease = func() {}, nil, 0
					break wait
				}
			}
		}
	}
}

// written is what the registration last wrote, and when.
type written struct {
	body  string // the registration without its Updated time
	at    time.Time
	lease clientv3.LeaseID
}

// quietPut is the longest the registration goes unwritten while nothing
// in it changes: readers call a registration older than 10 s stale. Every
// put is a raft write, so an unchanged one is not repeated at every
// refresh.
const quietPut = 5 * time.Second

// refresh grants a lease if there is none (Register keeps it alive) and writes
// the replica's current health when it changed, or quietPut has passed.
func refresh(ctx context.Context, cfg RegistryConfig, key string, ttl int64, lease *clientv3.LeaseID, r *Replica, w *written) error {
	r.Health = "ok"
	if cfg.Health != nil {
		hctx, cancel := context.WithTimeout(ctx, cfg.Every)
		if err := cfg.Health(hctx); err != nil {
			r.Health = err.Error()
		}
		cancel()
	}
	if cfg.Broker != nil {
		r.Broker = "ok"
		if err := cfg.Broker(); err != nil {
			r.Broker = err.Error()
		}
	}
	r.Draining = cfg.Draining != nil && cfg.Draining()
	r.Loading = nil
	if cfg.Loading != nil {
		r.Loading = cfg.Loading()
	}
	r.Busy, r.Waiting = false, false
	if cfg.Activity != nil {
		r.Busy, r.Waiting = cfg.Activity()
	}
	r.Updated = cfg.Clock.Now().UTC()
	r.LeaderToken, r.LeaderSince = 0, time.Time{}
	if cfg.Leading != nil {
		if tok, since := cfg.Leading(); tok != 0 {
			r.LeaderToken, r.LeaderSince = tok, since.UTC()
		}
	}
	octx, cancel := context.WithTimeout(ctx, max(cfg.Every, time.Second))
	defer cancel()
	if *lease == 0 {
		g, err := cfg.Client.Grant(octx, ttl)
		if err != nil {
			return fmt.Errorf("election: grant registration lease: %w", err)
		}
		*lease = g.ID
	}
	updated := r.Updated
	r.Updated = time.Time{}
	body, _ := json.Marshal(r)
	r.Updated = updated
	if string(body) == w.body && *lease == w.lease && updated.Sub(w.at) < quietPut {
		return nil
	}
	b, _ := json.Marshal(r)
	if _, err := cfg.Client.Put(octx, key, string(b), clientv3.WithLease(*lease)); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			*lease = 0 // expired before its keep-alive said so: grant anew
		}
		return fmt.Errorf("election: register %s: %w", r.ID, err)
	}
	*w = written{body: string(body), at: updated, lease: *lease}
	return nil
}

// Replicas lists the registered replicas of the cluster under prefix, by
// ID. A value this version cannot read is listed with only its ID and the
// reason as its health.
func Replicas(ctx context.Context, cli *clientv3.Client, prefix string) ([]Replica, error) {
	resp, err := cli.Get(ctx, replicaPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("election: list replicas: %w", err)
	}
	out := make([]Replica, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r Replica
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			r = Replica{Health: "unreadable registration: " + err.Error()}
		}
		r.ID = strings.TrimPrefix(string(kv.Key), replicaPrefix(prefix))
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ErrNotRegistered means the leader has no registration, so its HTTP
// address is unknown: it has just started, or runs a release that does
// not register.
var ErrNotRegistered = errors.New("election: leader has not registered an HTTP address")

// URL is the base URL the replica's HTTP server answers at, with a
// scheme even when an older release registered only host:port.
func (r Replica) URL() string {
	if r.HTTP == "" || strings.Contains(r.HTTP, "://") {
		return strings.TrimSuffix(r.HTTP, "/")
	}
	return "http://" + r.HTTP
}

// LeaderURL is where the leader's HTTP server answers, from the
// registrations in replicas: the one answer to "where is the cluster's
// HTTP" for the console and the CLI. It fails with ErrNotRegistered when
// the leader is not among them.
func LeaderURL(leader Leader, replicas []Replica) (string, error) {
	for _, r := range replicas {
		if r.ID == leader.ID && r.HTTP != "" {
			return r.URL(), nil
		}
	}
	return "", fmt.Errorf("%w (leader %s)", ErrNotRegistered, leader.ID)
}

// FindLeader observes the leader of the cluster under prefix and where
// its HTTP server answers (LeaderURL). It fails with ErrNoLeader while
// nobody leads.
func FindLeader(ctx context.Context, cli *clientv3.Client, prefix string) (Leader, string, error) {
	l, err := Observe(ctx, cli, prefix)
	if err != nil {
		return l, "", err
	}
	reps, err := Replicas(ctx, cli, prefix)
	if err != nil {
		return l, "", err
	}
	u, err := LeaderURL(l, reps)
	return l, u, err
}
