package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Redis replication is asynchronous: a write the master acknowledged can
// vanish when a replica that never received it is promoted. If that write
// was a publish, beatd has already recorded the slot as done in etcd, and
// the slot is never sent. With MinReplicas set, every publish batch ends
// with WAIT, and the batch only counts as done once enough replicas hold
// it; otherwise its fires report ResultError, stay pending and are
// published again (the dedup key makes that a no-op where the first write
// survived, and a real publish where it did not).

// ReplicasAuto is Options.MinReplicas for "wait for one replica whenever
// the master has at least one", re-checked every autoRecheck and after
// every failed publish (a failover shows up as one). It is the default for
// Sentinel brokers.
const ReplicasAuto = -1

// DefaultReplicasTimeout is how long WAIT blocks by default.
const DefaultReplicasTimeout = time.Second

// autoRecheck is how often ReplicasAuto counts the master's replicas.
const autoRecheck = time.Second

// DefaultReplicasAutoGrace is how long ReplicasAuto keeps waiting for a
// replica after the master was last seen with one. A master that has just
// lost its replica is, as often as not, the old master of a Sentinel
// failover in progress: it still takes writes, and the full resync that
// demotes it discards them. Waiting through the failover keeps those
// slots pending (published again on the new master, deduplicated);
// only a master without a replica for this long is published to alone.
const DefaultReplicasAutoGrace = 30 * time.Second

// ErrReplicaShortfall means fewer replicas than Options.MinReplicas
// acknowledged a publish within the timeout: its fires stay pending.
var ErrReplicaShortfall = errors.New("redis: too few replicas acknowledged the publish")

// replication is the WAIT step of publishing.
type replication struct {
	want       int // 0: off, > 0: fixed, ReplicasAuto
	timeout    time.Duration
	syncKey    string
	shortfalls prometheus.Counter
	clock      clockwork.Clock // the re-count's period and the grace

	auto      atomic.Int32          // ReplicasAuto's current target
	checkedAt atomic.Int64          // when auto was last counted, unix ns; 0 forces a count
	seenAt    atomic.Int64          // when the master was last seen with a replica, unix ns
	grace     time.Duration         // DefaultReplicasAutoGrace unless set
	lastErr   atomic.Pointer[error] // the last WAIT's failure; nil once one succeeds
}

func newReplication(opts Options) *replication {
	r := &replication{want: opts.MinReplicas, timeout: opts.MinReplicasTimeout,
		syncKey: opts.KeyPrefix + "replsync", shortfalls: opts.ReplicaShortfalls, clock: opts.Clock}
	if r.want < ReplicasAuto {
		r.want = 0
	}
	if r.timeout <= 0 {
		r.timeout = DefaultReplicasTimeout
	}
	r.grace = opts.ReplicasAutoGrace
	if r.grace <= 0 {
		r.grace = DefaultReplicasAutoGrace
	}
	return r
}

// target is how many replicas the next batch waits for.
func (r *replication) target(ctx context.Context, rdb redis.UniversalClient) int {
	if r.want != ReplicasAuto {
		return r.want
	}
	if r.clock.Since(time.Unix(0, r.checkedAt.Load())) >= autoRecheck {
		if err := r.count(ctx, rdb); err != nil {
			// Keep the last known target; the next batch tries again.
			r.checkedAt.Store(0)
		}
	}
	return int(r.auto.Load())
}

// count sets the auto target from the master's online replicas.
func (r *replication) count(ctx context.Context, rdb redis.UniversalClient) error {
	info, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("redis: count replicas (INFO replication): %w", err)
	}
	n := min(onlineReplicas(info), 1)
	now := r.clock.Now()
	if n > 0 {
		r.seenAt.Store(now.UnixNano())
	} else if seen := r.seenAt.Load(); seen != 0 && now.Sub(time.Unix(0, seen)) < r.grace {
		n = 1 // just lost its replica: likely a failover's old master (DefaultReplicasAutoGrace)
	}
	r.auto.Store(int32(n))
	r.checkedAt.Store(now.UnixNano())
	return nil
}

// failed makes the next batch re-count replicas in auto mode: a failed
// publish is how a failover shows itself.
func (r *replication) failed() { r.checkedAt.Store(0) }

// onlineReplicas counts "slaveN:...,state=online,..." lines of INFO
// replication; a replica still syncing cannot acknowledge anything yet.
func onlineReplicas(info string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "state=online") {
			n++
		}
	}
	return n
}

// queue appends the WAIT step to pipe, after the publishes, and returns
// its command (nil when no replica is waited for). The SET of syncKey
// comes first because WAIT waits for this connection's last write: a batch
// of only duplicates writes nothing, and WAIT would return at once even
// though the writes it found may not have reached a replica yet.
func (r *replication) queue(ctx context.Context, pipe redis.Pipeliner, want int, token string) *redis.IntCmd {
	if want <= 0 {
		return nil
	}
	pipe.Set(ctx, r.syncKey, token, 0)
	return r.queueWait(ctx, pipe, want)
}

// queueWait appends WAIT alone, for a connection whose last write was
// the marker (a publish's transaction writes it).
func (r *replication) queueWait(ctx context.Context, pipe redis.Pipeliner, want int) *redis.IntCmd {
	// A pipeline reads every reply within the client's ReadTimeout, so the
	// broker client must allow more than the WAIT timeout (BrokerConfig).
	wait := redis.NewIntCmd(ctx, "wait", want, r.timeout.Milliseconds())
	_ = pipe.Process(ctx, wait)
	return wait
}

// check turns the batch's successes into ResultError unless WAIT saw
// enough replicas; it returns why.
func (r *replication) check(wait *redis.IntCmd, want int, results []broker.Result) error {
	if wait == nil {
		r.lastErr.Store(nil) // nothing to wait for (auto mode without replicas)
		return nil
	}
	got, err := wait.Result()
	if err == nil && int(got) >= want {
		r.lastErr.Store(nil)
		return nil
	}
	werr := r.fail(got, want, err, results)
	r.lastErr.Store(&werr)
	return werr
}

func (r *replication) fail(got int64, want int, err error, results []broker.Result) error {
	demoted := 0
	for i, res := range results {
		if res == broker.ResultOK || res == broker.ResultDuplicate {
			results[i] = broker.ResultError
			demoted++
		}
	}
	if err != nil {
		return fmt.Errorf("redis: WAIT %d: %w", want, err)
	}
	if r.shortfalls != nil {
		r.shortfalls.Inc()
	}
	return fmt.Errorf("%w: %d of %d replicas within %s; %d fires stay pending",
		ErrReplicaShortfall, got, want, r.timeout, demoted)
}

// sync waits until want replicas hold every write the master has
// acknowledged so far (used after raising the fence).
func (r *replication) sync(ctx context.Context, rdb redis.UniversalClient, token string) error {
	want := r.target(ctx, rdb)
	if want <= 0 {
		return nil
	}
	pipe := rdb.Pipeline()
	wait := r.queue(ctx, pipe, want, token)
	if _, err := pipe.Exec(ctx); err != nil && wait.Err() == nil {
		return fmt.Errorf("redis: replication marker: %w", err)
	}
	return r.check(wait, want, nil)
}

// MinReplicas is the number of replicas each publish batch currently waits
// for (0: none).
func (p *Publisher) MinReplicas(ctx context.Context) int { return p.repl.target(ctx, p.rdb) }

// OnlineReplicas counts the master's online replicas (INFO replication).
func (p *Publisher) OnlineReplicas(ctx context.Context) (int, error) {
	info, err := p.rdb.Info(ctx, "replication").Result()
	if err != nil {
		return 0, fmt.Errorf("redis: INFO replication: %w", err)
	}
	return onlineReplicas(info), nil
}

// ReplicationError is the last publish or fence raise that too few
// replicas acknowledged (or whose WAIT failed), nil once one succeeds.
// Readiness reports it: a leader stuck raising the fence has published
// nothing to fail yet.
func (p *Publisher) ReplicationError() error {
	if e := p.repl.lastErr.Load(); e != nil {
		return *e
	}
	return nil
}
