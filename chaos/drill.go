package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"

	"github.com/beatd/beatd/testkit/harness"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Fault kinds.
const (
	FaultKill         = "kill"          // kill -9 the leader, restart it later
	FaultStop         = "stop"          // SIGSTOP the leader past the TTL, then SIGCONT
	FaultTerm         = "term"          // SIGTERM the leader, then restart (rolling restart)
	FaultEtcdKill     = "etcd-kill"     // kill the etcd member that is raft leader
	FaultEtcdQuorum   = "etcd-quorum"   // stop 2 of 3 members, then restore them
	FaultRedisRestart = "redis-restart" // kill redis-server, restart it
	FaultPartition    = "partition"     // blackhole the leader's traffic to etcd or Redis
	// FaultBrokerPartition blackholes only the leader's path to the
	// broker, for longer than --broker-failover-after (twice the lease
	// TTL in a drill): the leader must hand over to a standby that
	// reaches the broker.
	FaultBrokerPartition = "broker-partition"
	// FaultRedisFailover fails the Redis master over to its replica, by
	// SENTINEL FAILOVER or by kill -9 of the master (then restarted as a
	// replica). Only with LocalConfig.Sentinel.
	FaultRedisFailover = "redis-failover"
	// FaultEtcdSlow makes every answer of etcd to every replica late by
	// LocalConfig.EtcdDelay (else 200–500 ms) for a few lease TTLs: a
	// stand-in, on the client paths, for the slow fsync of a slow disk
	// under etcd (no FUSE or dm-delay device here, and etcd's failpoints
	// need a gofail build). Not in AllFaults: chosen by name.
	FaultEtcdSlow = "etcd-slow"
)

// AllFaults lists every fault kind.
var AllFaults = []string{FaultKill, FaultStop, FaultTerm, FaultEtcdKill, FaultEtcdQuorum, FaultRedisRestart, FaultPartition, FaultBrokerPartition}

// SentinelFaults lists every fault kind of a drill with Sentinel. There,
// redis-restart restarts the replica and partition cuts only etcd (beatd
// reaches Redis through Sentinel, not through a proxy).
var SentinelFaults = append(append([]string{}, AllFaults...), FaultRedisFailover)

// Fault is one injected fault.
type Fault struct {
	Kind   string        `json:"kind"`
	At     time.Time     `json:"at"`
	Target string        `json:"target"`
	Token  int64         `json:"leader_token"` // the leader's token when it struck
	Held   time.Duration `json:"held_ns"`
	Gap    time.Duration `json:"failover_gap_ns,omitempty"`
	// Elected is the time from the fault to a newer term's election.
	Elected time.Duration `json:"elected_after_ns,omitempty"`
}

// LocalConfig configures RunLocal.
type LocalConfig struct {
	Binary   string // the beatd binary to run as replicas
	Replicas int
	Duration time.Duration
	Seed     int64
	Faults   []string
	LeaseTTL time.Duration
	// MinEach keeps injecting past Duration until every kind in Faults was
	// injected at least this often.
	MinEach int
	Dir     string    // work directory; a temporary one when empty
	Log     io.Writer // progress
	// Broker is BrokerRedis (the default) or BrokerAMQP: a rabbitmq-server
	// in place of redis-server, audited by draining its queue.
	Broker string
	// Sentinel runs Redis as a master, a replica and three sentinels, and
	// beatd with a sentinel:// broker (and its default
	// --broker-min-replicas), instead of one redis-server behind proxies.
	Sentinel bool
	// Topology is TopologyExternal (the default) or TopologyEmbedded.
	Topology string
	// EtcdDelay is etcd-slow's delay (0: 200–500 ms at random each time).
	EtcdDelay time.Duration
	// Shards runs the replicas with --shards Shards (0 or 1: unsharded),
	// adds a spare replica for shard-move, and draws from ShardFaults.
	Shards int
	// Rabbit, with Broker BrokerAMQP, is a running rabbitmq-server to
	// drill on instead of starting one: a node takes tens of seconds to
	// start on a loaded machine, so a test package starts one for all its
	// drills. The drill restarts it on rabbit-restart and leaves it
	// running. Drills on one node run one at a time, each with its own
	// Prefix: the prefix names the fence and journal queues.
	Rabbit *harness.Rabbit
	// Prefix is the cluster's etcd prefix (default /beatd/drill/).
	Prefix string
}

// DrillSchedule is the schedule drills run: many 1-second entries with
// mixed catch-up policies and crontab entries every minute, on queue
// "drill".
const DrillSchedule = `# beatd drill schedule
defaults:
  options: {queue: drill}
  catchup_window: 10m
entries:
  every-all-1: {task: drill.tick, every: 1s, relative: true, catchup: all, args: [1]}
  every-all-2: {task: drill.tick, every: 1s, relative: true, catchup: all, args: [2]}
  every-all-3: {task: drill.tick, every: 1s, relative: true, catchup: all, args: [3]}
  every-all-4: {task: drill.tick, every: 1s, relative: true, catchup: all, args: [4]}
  every-all-5: {task: drill.tick, every: 1s, relative: true, catchup: all, args: [5]}
  every-all-6: {task: drill.tick, every: 1s, relative: true, catchup: all, args: [6], options: {priority: 9}}
  every-once-1: {task: drill.tick, every: 1s, relative: true, catchup: once, args: [7]}
  every-once-2: {task: drill.tick, every: 1s, relative: true, catchup: once, args: [8]}
  every-once-3: {task: drill.tick, every: 1s, relative: true, catchup: once, args: [9], options: {priority: 5}}
  every-skip-1: {task: drill.tick, every: 1s, relative: true, catchup: skip, args: [10]}
  every-skip-2: {task: drill.tick, every: 1s, relative: true, catchup: skip, args: [11]}
  every-2s-all: {task: drill.tick, every: 2s, relative: true, catchup: all, args: [12]}
  every-3s-once: {task: drill.tick, every: 3s, relative: true, catchup: once, args: [13]}
  cron-seconds: {task: drill.tick, cron: "*/5 * * * * *", catchup: all, args: [14]}
  crontab-minute-all: {task: drill.tick, crontab: {minute: "*"}, catchup: all, args: [15]}
  crontab-minute-once: {task: drill.tick, crontab: {minute: "*"}, catchup: once, args: [16]}
  cron-minute-skip: {task: drill.tick, cron: "* * * * *", catchup: skip, args: [17]}
`

type drill struct {
	cfg      LocalConfig
	dir      string
	etcd     *harness.EtcdCluster
	redis    *harness.RedisProc
	rabbit   *harness.Rabbit
	sentinel *harness.SentinelTopology
	replicas []*Replica
	cli      *clientv3.Client
	rng      *rand.Rand
	logf     func(format string, args ...any)
	prefix   string
	fabric   *Fabric  // embedded topology: the etcd ports' network
	members  []member // embedded topology: replica i's member
	// shards is the sharded drill's state (nil: unsharded).
	shards *shardDrill
}

// RunLocal builds a cluster on loopback (a 3-member etcd, redis-server with
// AOF, cfg.Replicas beatd processes behind fault proxies), runs the drill
// schedule while injecting faults at seeded random times, then audits
// everything enqueued.
func RunLocal(ctx context.Context, cfg LocalConfig) (*Report, error) {
	if cfg.Replicas < 2 {
		return nil, errors.New("chaos: a drill needs at least 2 replicas")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	known := AllFaults
	switch cfg.Broker {
	case "", BrokerRedis:
		cfg.Broker = BrokerRedis
	case BrokerAMQP:
		known = AMQPFaults
	default:
		return nil, fmt.Errorf("chaos: unknown broker %q (redis or amqp)", cfg.Broker)
	}
	if cfg.Shards < 0 || cfg.Shards > maxDrillShards {
		return nil, fmt.Errorf("chaos: --shards %d: want 1 to %d (0: unsharded)", cfg.Shards, maxDrillShards)
	}
	if cfg.Shards > 1 && (cfg.Sentinel || cfg.Topology == TopologyEmbedded) {
		return nil, errors.New("chaos: a sharded drill runs the external topology on one redis-server or RabbitMQ (no --sentinel, no embedded topology)")
	}
	if cfg.Shards > 1 {
		known = shardFaults(cfg.Broker)
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = known
		if cfg.Sentinel {
			cfg.Faults = SentinelFaults
		}
	}
	if cfg.Sentinel {
		known = SentinelFaults
	}
	known = append(slices.Clone(known), FaultEtcdSlow)
	if cfg.Shards > 1 {
		// By name only: a shard leader cut from the broker keeps its
		// shards (no broker-path handover per shard, docs/shards.md).
		known = append(known, FaultBrokerPartition)
	}
	for _, f := range cfg.Faults {
		if !contains(known, f) {
			return nil, fmt.Errorf("chaos: unknown fault %q for %s (known: %s)", f, cfg.Broker, strings.Join(known, ","))
		}
		if f == FaultRedisFailover && !cfg.Sentinel {
			return nil, fmt.Errorf("chaos: fault %q needs a drill with Sentinel", f)
		}
		if isShardFault(f) && cfg.Shards < 2 {
			return nil, fmt.Errorf("chaos: fault %q needs a sharded drill (--shards 2 or more)", f)
		}
		if f == FaultShardMove && cfg.Shards <= cfg.Replicas {
			// With the spare, each replica's least share is 0: nothing
			// is owed to it, so nothing moves.
			return nil, fmt.Errorf("chaos: fault %q needs more shards than replicas (--shards %d, --replicas %d), so the joining one is owed a shard", f, cfg.Shards, cfg.Replicas)
		}
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Topology == "" {
		cfg.Topology = TopologyExternal
	}
	if cfg.Topology != TopologyExternal && cfg.Topology != TopologyEmbedded {
		return nil, fmt.Errorf("chaos: unknown topology %q (external or embedded)", cfg.Topology)
	}
	if cfg.Topology == TopologyEmbedded && (cfg.Broker == BrokerAMQP || cfg.Sentinel) {
		return nil, fmt.Errorf("chaos: the embedded topology drills a single redis-server (no --broker amqp or --sentinel)")
	}
	if cfg.Rabbit != nil && cfg.Broker != BrokerAMQP {
		return nil, errors.New("chaos: a RabbitMQ node given to a drill on another broker")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/beatd/drill/"
	}
	d := &drill{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed)), prefix: cfg.Prefix}
	if cfg.Shards > 1 {
		d.shards = &shardDrill{epochs: []shardEpoch{{count: cfg.Shards}}}
	}
	d.logf = func(format string, args ...any) {
		fmt.Fprintf(cfg.Log, "%s  "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05.000")}, args...)...)
	}
	d.dir = cfg.Dir
	if d.dir == "" {
		dir, err := os.MkdirTemp("", "beatd-drill-")
		if err != nil {
			return nil, err
		}
		d.dir = dir
	}
	defer d.shutdown()
	if err := d.setup(); err != nil {
		return nil, err
	}
	return d.run(ctx)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (d *drill) setup() error {
	if d.embedded() {
		return d.setupEmbedded()
	}
	var err error
	if d.etcd, err = harness.StartEtcdCluster(d.dir, 3, nil, harness.EtcdFast...); err != nil {
		return err
	}
	brokerAddr := ""
	switch {
	case d.cfg.Broker == BrokerAMQP && d.cfg.Rabbit != nil:
		// A shared node: up (an earlier drill may have failed while it
		// was down for rabbit-restart), and without an earlier drill's
		// messages in the drill queue the audit reads.
		d.rabbit = d.cfg.Rabbit
		if err := d.rabbit.Start(); err != nil {
			return err
		}
		if err := d.deleteDrillQueue(); err != nil {
			return err
		}
		brokerAddr = fmt.Sprintf("127.0.0.1:%d", d.rabbit.Port)
	case d.cfg.Broker == BrokerAMQP:
		if d.rabbit, err = harness.StartRabbit(filepath.Join(d.dir, "rabbit")); err != nil {
			return err
		}
		brokerAddr = fmt.Sprintf("127.0.0.1:%d", d.rabbit.Port)
	case d.cfg.Sentinel:
		if d.sentinel, err = harness.StartSentinelTopology(filepath.Join(d.dir, "sentinel")); err != nil {
			return err
		}
		brokerAddr = d.sentinel.URL(0)
	default:
		if d.redis, err = harness.StartRedis(d.dir, true); err != nil {
			return err
		}
		brokerAddr = d.redis.Addr()
	}
	if d.cli, err = clientv3.New(clientv3.Config{Endpoints: d.etcd.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()}); err != nil {
		return err
	}
	config := filepath.Join(d.dir, "drill.yaml")
	if err := os.WriteFile(config, []byte(DrillSchedule), 0o644); err != nil {
		return err
	}
	n := d.cfg.Replicas
	if d.shards != nil {
		n++ // the spare that shard-move starts and stops
	}
	for i := 0; i < n; i++ {
		r := &Replica{Replica: &harness.Replica{ID: fmt.Sprintf("drill-%d", i), Bin: d.cfg.Binary,
			LogPath: filepath.Join(d.dir, fmt.Sprintf("replica-%d.log", i))}}
		var eps []string
		for _, m := range d.etcd.Members {
			p, err := harness.NewProxy(m.ClientAddr())
			if err != nil {
				return err
			}
			r.EtcdProxies = append(r.EtcdProxies, p)
			eps = append(eps, "http://"+p.Addr())
		}
		var broker []string
		switch {
		case d.cfg.Sentinel:
			broker = []string{"--broker", d.sentinelBroker(), "--broker-master-name", d.masterName()}
		default:
			if r.RedisProxy, err = harness.NewProxy(brokerAddr); err != nil {
				return err
			}
			broker = []string{"--broker", "redis://" + r.RedisProxy.Addr() + "/0"}
			if d.cfg.Broker == BrokerAMQP {
				// The default heartbeat (2 s), as in production: RabbitMQ
				// drops a paused leader's connection, and so its fence
				// lock, a few seconds after it stopped; the new leader
				// waits for that.
				broker = []string{"--broker", "amqp://guest:guest@" + r.RedisProxy.Addr() + "//"}
			}
		}
		if r.HTTPPort, err = harness.FreePort(); err != nil {
			return err
		}
		r.Args = append([]string{"run", "--config", config, "--etcd-endpoints", strings.Join(eps, ","),
			"--id", r.ID, "--lease-ttl", d.cfg.LeaseTTL.String(),
			"--prefix", d.prefix, "--http", "127.0.0.1:" + strconv.Itoa(r.HTTPPort), "--log-format", "json"}, broker...)
		if d.shards != nil {
			// Every fire logged: the audit reads when each was fired
			// (a once or skip slot pending past StepLateness is dropped).
			r.Args = append(r.Args, "--log-fires", "100000", "--shards", strconv.Itoa(d.cfg.Shards))
			if i == d.cfg.Replicas {
				d.shards.spare = r
				d.replicas = append(d.replicas, r)
				continue
			}
		}
		if err := r.Start(); err != nil {
			return err
		}
		d.replicas = append(d.replicas, r)
	}
	d.logf("cluster up: etcd %v, %s %s, %d replicas, lease TTL %s, work dir %s",
		d.etcd.Endpoints(), d.cfg.Broker, brokerAddr, len(d.replicas), d.cfg.LeaseTTL, d.dir)
	return nil
}

func (d *drill) shutdown() {
	for _, r := range d.replicas {
		r.Kill()
		for _, p := range r.EtcdProxies {
			p.Close()
		}
		if r.RedisProxy != nil {
			r.RedisProxy.Close()
		}
	}
	if d.cli != nil {
		d.cli.Close()
	}
	if d.redis != nil {
		d.redis.Kill()
	}
	if d.rabbit != nil && d.cfg.Rabbit == nil {
		d.rabbit.Close()
	}
	if d.sentinel != nil {
		d.sentinel.Stop()
	}
	if d.etcd != nil {
		d.etcd.Stop()
	}
	if d.fabric != nil {
		d.fabric.Close()
	}
}

// leader waits for a leader and returns its replica and token.
func (d *drill) leader(ctx context.Context, timeout time.Duration) (*Replica, int64, error) {
	if d.shards != nil {
		return d.shardTarget(ctx, timeout)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		// The leader is the oldest key under the election prefix (as
		// election.Observe reads it; chaos cannot import election, whose
		// tests use chaos).
		octx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := d.cli.Get(octx, keys.Leaders(d.prefix), clientv3.WithFirstCreate()...)
		cancel()
		if err == nil && len(resp.Kvs) > 0 {
			for _, r := range d.replicas {
				if r.ID == string(resp.Kvs[0].Value) {
					return r, resp.Kvs[0].CreateRevision, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, 0, fmt.Errorf("chaos: no leader within %s", timeout)
}

func (d *drill) sleep(ctx context.Context, dur time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(dur):
		return nil
	}
}

func (d *drill) run(ctx context.Context) (*Report, error) {
	if _, _, err := d.leader(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	if d.shards != nil {
		// Every shard led and the first handovers done, so each entry has
		// started (a new entry is owed slots from its first scheduling
		// only): a shard handed over before its first term began
		// scheduling left its entries' first seconds unowed.
		if _, ok := d.allLed(ctx, 60*time.Second, true, nil); !ok {
			return nil, errors.New("chaos: the shards were not led and balanced within 60s of the start")
		}
		if err := d.sleep(ctx, time.Second); err != nil {
			return nil, err
		}
	}
	if err := d.sleep(ctx, 2*time.Second); err != nil {
		return nil, err
	}
	from := time.Now().Truncate(time.Second).Add(time.Second)
	deadline := from.Add(d.cfg.Duration)
	var faults []Fault
	order := d.rng.Perm(len(d.cfg.Faults))
	counts := map[string]int{}
	enough := func() bool {
		for _, k := range d.cfg.Faults {
			if counts[k] < d.cfg.MinEach {
				return false
			}
		}
		return true
	}
	for n := 0; time.Now().Before(deadline) || !enough(); n++ {
		if err := d.sleep(ctx, time.Duration(500+d.rng.IntN(2500))*time.Millisecond); err != nil {
			return nil, err
		}
		// Cycle through the kinds in a seeded order, so a short drill has
		// each kind at least once per round.
		if n > 0 && n%len(order) == 0 {
			order = d.rng.Perm(len(d.cfg.Faults))
		}
		kind := d.cfg.Faults[order[n%len(order)]]
		f, err := d.inject(ctx, kind)
		if err != nil {
			return nil, err
		}
		faults = append(faults, f)
		counts[kind]++
		if d.shards != nil {
			d.settleShards(ctx, f)
		}
	}
	// Settle: a leader, one that publishes again (a leader key can outlive
	// its holder by a TTL, renewed in full whenever raft leadership moves,
	// which the embedded topology's faults make it do often), and time for
	// it to catch up.
	if _, _, err := d.leader(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	if err := d.waitPublishing(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	if err := d.sleep(ctx, d.cfg.LeaseTTL+3*time.Second); err != nil {
		return nil, err
	}
	to := time.Now().Add(-2 * time.Second)
	allTerms := -1.0
	// A sharded replica's shards export no beatd_amqp_resends_all_terms
	// (docs/shards.md): there only the logged re-sends explain a copy.
	if d.cfg.Broker == BrokerAMQP && d.shards == nil {
		if lead, _, err := d.leader(ctx, 30*time.Second); err == nil {
			allTerms = scrapeSum(lead.HTTPPort, "beatd_amqp_resends_all_terms")
		}
	}
	d.logf("stopping replicas (SIGTERM)")
	for _, r := range d.replicas {
		r.Signal(syscall.SIGTERM)
	}
	for _, r := range d.replicas {
		if !r.Wait(15 * time.Second) {
			r.Kill()
		}
	}
	msgs, err := d.readQueue(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := config.Parse("drill.yaml", []byte(DrillSchedule))
	if err != nil {
		return nil, err
	}
	logs := d.readLogs()
	if d.shards != nil {
		for i, t := range logs.terms {
			logs.terms[i] = d.shards.shardTerm(t)
		}
	}
	fired := map[string]time.Time{}
	for _, l := range logs.fires {
		if slot, err := time.Parse(time.RFC3339Nano, l.Slot); err == nil {
			if k := FiredKey(l.Entry, slot); fired[k].IsZero() || l.Time.Before(fired[k]) {
				fired[k] = l.Time
			}
		}
	}
	rep := AuditWithTimeline(cfg, msgs, from, to, logs.terms, fired)
	rep.Seed, rep.Duration, rep.Replicas = d.cfg.Seed, d.cfg.Duration.String(), d.cfg.Replicas
	logs.report(rep, faults)
	if d.cfg.Broker == BrokerAMQP {
		rep.FencedPublishes = len(FencedPublishesBy(msgs, d.fence))
		explainResends(rep, logs.resent)
		rep.ResendsAllTerms = allTerms
		if extra := extraCopies(rep.DuplicatesInWindow); allTerms >= 0 && float64(extra) > allTerms {
			// A re-send that the leader's all-terms count misses.
			rep.OK = false
		}
	}
	if d.shards != nil {
		d.shardChecks(rep, msgs, logs)
	}
	return rep, nil
}

// deleteDrillQueue deletes the drill queue of a shared RabbitMQ node.
func (d *drill) deleteDrillQueue() error {
	conn, err := d.rabbit.Dial()
	if err != nil {
		return fmt.Errorf("chaos: dial the shared RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("chaos: open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete("drill", false, false, false); err != nil {
		return fmt.Errorf("chaos: delete the drill queue: %w", err)
	}
	return nil
}

// readQueue drains the drill queue of whichever broker runs.
func (d *drill) readQueue(ctx context.Context) ([]Message, error) {
	if d.rabbit != nil {
		conn, err := d.rabbit.Dial()
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return ReadQueueAMQP(conn, "drill")
	}
	rdb, err := d.auditClient(ctx) // with Sentinel, the final master
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	return ReadQueue(ctx, rdb, "drill")
}

// waitPublishing waits until the drill queue's newest message is for a
// slot after the call began.
func (d *drill) waitPublishing(ctx context.Context, timeout time.Duration) error {
	since := time.Now()
	if d.rabbit != nil {
		// Reading a RabbitMQ queue consumes it: the audit covers the end
		// of the run.
		return nil
	}
	rdb, err := d.brokerClient(timeout)
	if err != nil {
		return err
	}
	defer rdb.Close()
	for time.Since(since) < timeout {
		raw, err := rdb.LIndex(ctx, "drill", 0).Result()
		if err == nil {
			var m struct {
				Headers struct {
					Slot string `json:"beat_slot"`
				} `json:"headers"`
			}
			if json.Unmarshal([]byte(raw), &m) == nil {
				if slot, err := time.Parse(time.RFC3339Nano, m.Headers.Slot); err == nil && slot.After(since) {
					return nil
				}
			}
		}
		if err := d.sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("chaos: nothing published for %s after the last fault", timeout)
}

// inject applies one fault and holds it, then restores.
func (d *drill) inject(ctx context.Context, kind string) (Fault, error) {
	if d.embedded() {
		// A killed replica is also a killed member: strike only once every
		// member serves again, so each fault's failover time is its own.
		if err := d.waitMembersHealthy(60 * time.Second); err != nil {
			return Fault{}, err
		}
	}
	lead, token, err := d.leader(ctx, 30*time.Second)
	if err != nil {
		return Fault{}, err
	}
	ttl := d.cfg.LeaseTTL
	f := Fault{Kind: kind, At: time.Now(), Target: lead.ID, Token: token}
	if d.embedded() {
		if handled, err := d.injectEmbedded(ctx, &f, lead); handled {
			d.logf("fault %-13s target %-16s token %d held %s", kind, f.Target, token, f.Held.Round(time.Millisecond))
			return f, err
		}
	}
	if isShardFault(kind) {
		err := d.injectShard(ctx, &f, lead)
		d.logf("fault %-13s target %-16s token %d held %s", kind, f.Target, token, f.Held.Round(time.Millisecond))
		return f, err
	}
	switch kind {
	case FaultKill:
		lead.Kill()
		f.Held = ttl + time.Second
		if err := d.sleep(ctx, f.Held); err != nil {
			return f, err
		}
		err = lead.Start()
	case FaultStop:
		lead.Signal(syscall.SIGSTOP)
		f.Held = ttl + time.Duration(500+d.rng.IntN(1500))*time.Millisecond
		if err := d.sleep(ctx, f.Held); err != nil {
			lead.Signal(syscall.SIGCONT)
			return f, err
		}
		lead.Signal(syscall.SIGCONT)
	case FaultTerm:
		lead.Signal(syscall.SIGTERM)
		if !lead.Wait(15 * time.Second) {
			lead.Kill()
		}
		f.Held = time.Since(f.At)
		err = lead.Start()
	case FaultEtcdKill:
		m, rerr := d.etcd.RaftLeader(ctx)
		if rerr != nil {
			m = d.etcd.Members[d.rng.IntN(len(d.etcd.Members))]
		}
		f.Target = m.Name
		d.etcd.Kill(m)
		f.Held = time.Duration(1000+d.rng.IntN(2000)) * time.Millisecond
		if err := d.sleep(ctx, f.Held); err != nil {
			return f, err
		}
		err = d.etcd.Start(m)
	case FaultEtcdQuorum:
		perm := d.rng.Perm(len(d.etcd.Members))
		a, b := d.etcd.Members[perm[0]], d.etcd.Members[perm[1]]
		f.Target = a.Name + "," + b.Name
		d.etcd.Kill(a)
		d.etcd.Kill(b)
		f.Held = time.Duration(2000+d.rng.IntN(3000)) * time.Millisecond
		if err := d.sleep(ctx, f.Held); err != nil {
			return f, err
		}
		if err = d.etcd.Start(a); err == nil {
			err = d.etcd.Start(b)
		}
		if err == nil {
			err = d.etcd.WaitHealthy(30 * time.Second)
		}
	case FaultRedisRestart:
		if d.sentinel != nil {
			err = d.restartSentinelReplica(ctx, &f)
			break
		}
		f.Target = "redis"
		d.redis.Kill()
		f.Held = time.Duration(300+d.rng.IntN(1500)) * time.Millisecond
		if err := d.sleep(ctx, f.Held); err != nil {
			return f, err
		}
		err = d.redis.Start()
	case FaultRabbitRestart:
		f.Target = "rabbitmq"
		d.rabbit.Kill()
		f.Held = time.Duration(300+d.rng.IntN(1500)) * time.Millisecond
		if err := d.sleep(ctx, f.Held); err != nil {
			return f, err
		}
		err = d.rabbit.Start()
	case FaultRedisFailover:
		err = d.redisFailover(&f)
	case FaultBrokerPartition:
		if lead.RedisProxy == nil {
			return f, fmt.Errorf("chaos: %s needs the replicas' broker proxies", kind)
		}
		f.Target = lead.ID + "->" + d.cfg.Broker
		lead.RedisProxy.Blackhole(true)
		// Past the handover (twice the TTL) and the hold that keeps the
		// cut leader out of the election for twice that.
		f.Held = 2*ttl + time.Duration(1000+d.rng.IntN(2000))*time.Millisecond
		serr := d.sleep(ctx, f.Held)
		lead.RedisProxy.Blackhole(false)
		lead.RedisProxy.Reset()
		if serr != nil {
			return f, serr
		}
	case FaultEtcdSlow:
		delay := d.cfg.EtcdDelay
		if delay <= 0 {
			delay = time.Duration(200+d.rng.IntN(301)) * time.Millisecond
		}
		f.Target = "etcd+" + delay.String()
		for _, r := range d.replicas {
			for _, p := range r.EtcdProxies {
				p.Delay(delay)
			}
		}
		f.Held = 3*ttl + time.Duration(d.rng.IntN(2000))*time.Millisecond
		serr := d.sleep(ctx, f.Held)
		for _, r := range d.replicas {
			for _, p := range r.EtcdProxies {
				p.Delay(0)
			}
		}
		if serr != nil {
			return f, serr
		}
	case FaultPartition:
		proxies := lead.EtcdProxies
		what := "etcd"
		if d.rng.IntN(2) == 1 && lead.RedisProxy != nil {
			proxies, what = []*harness.Proxy{lead.RedisProxy}, d.cfg.Broker
		}
		f.Target = lead.ID + "->" + what
		for _, p := range proxies {
			p.Blackhole(true)
		}
		f.Held = ttl + time.Duration(500+d.rng.IntN(1500))*time.Millisecond
		serr := d.sleep(ctx, f.Held)
		for _, p := range proxies {
			// The bytes the black hole dropped left the open streams
			// with frames missing, which real TCP never does (it
			// delivers them late or the connection dies): a replica's
			// etcd client then failed every lease grant with
			// RST_STREAM PROTOCOL_ERROR for 25 s after the cut ended.
			// Reset ends those connections, as a dead one would.
			p.Blackhole(false)
			p.Reset()
		}
		if serr != nil {
			return f, serr
		}
	}
	d.logf("fault %-13s target %-16s token %d held %s", kind, f.Target, token, f.Held.Round(time.Millisecond))
	return f, err
}

// shardHandoverLog is the message with which a sharded replica hands a
// shard over to one below its share (daemon/shards.go).
const shardHandoverLog = "handing a shard over to a replica that leads less than its share"

// logLine is the part of a replica's JSON log the report uses.
type logLine struct {
	Shard *int      `json:"shard"` // a sharded replica's shard
	Time  time.Time `json:"time"`
	Msg   string    `json:"msg"`
	Token int64     `json:"token"`
	Lag   string    `json:"lag"`
	Fires int       `json:"fires"`
	Entry string    `json:"entry"`
	Slot  string    `json:"slot"`
}

// replicaLogs is what only the replicas saw.
type replicaLogs struct {
	fires, elections []logLine
	terms            []Term
	stale            int
	resent           map[string]int // entry + "\x00" + slot -> re-sends logged (AMQP)
	// moves are the shard handovers: from a replica's "handing a shard
	// over" to the next "scheduling" of that shard.
	moves []time.Duration
}

// readLogs parses every replica's JSON log.
func (d *drill) readLogs() *replicaLogs {
	out := &replicaLogs{resent: map[string]int{}}
	type shardEvent struct {
		at       time.Time
		handover bool
		shard    int
	}
	var shardEvents []shardEvent
	for _, r := range d.replicas {
		f, err := os.Open(r.LogPath)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			switch l.Msg {
			case "fired":
				out.fires = append(out.fires, l)
			case resendLog:
				out.resent[l.Entry+"\x00"+l.Slot]++
			case "stale publish refused":
				out.stale += l.Fires
			case "elected leader":
				out.elections = append(out.elections, l)
				t := Term{Start: l.Time, Token: l.Token}
				if l.Shard != nil {
					t.Shard = *l.Shard
				}
				out.terms = append(out.terms, t)
			case "scheduling", shardHandoverLog:
				if l.Shard != nil {
					shardEvents = append(shardEvents, shardEvent{at: l.Time, handover: l.Msg != "scheduling", shard: *l.Shard})
				}
			}
		}
		f.Close()
	}
	slices.SortFunc(shardEvents, func(a, b shardEvent) int { return a.at.Compare(b.at) })
	for i, e := range shardEvents {
		if !e.handover {
			continue
		}
		for _, next := range shardEvents[i+1:] {
			if !next.handover && next.shard == e.shard {
				out.moves = append(out.moves, next.at.Sub(e.at))
				break
			}
		}
	}
	return out
}

// report adds stale publishes, leader changes, fire lag, and each fault's
// failover gap (from the fault to the first fire under a newer token, or,
// for faults that need not move leadership, to the first fire after it)
// and handover (to a newer term's election).
func (lg *replicaLogs) report(rep *Report, faults []Fault) {
	fires, elections := lg.fires, lg.elections
	rep.StaleRejected = lg.stale
	rep.LeaderChanges = max(0, len(elections)-1)
	var lags []time.Duration
	for _, l := range fires {
		if lag, err := time.ParseDuration(l.Lag); err == nil {
			lags = append(lags, lag)
		}
	}
	rep.FireLag = StatsOf(lags)
	gaps := map[string][]time.Duration{}
	handovers := map[string][]time.Duration{}
	for i := range faults {
		f := &faults[i]
		var first time.Time
		moves := f.Kind == FaultKill || f.Kind == FaultStop || f.Kind == FaultTerm || f.Kind == FaultBrokerPartition || isShardFault(f.Kind) ||
			(f.Kind == FaultPartition && strings.HasSuffix(f.Target, "etcd"))
		for _, l := range fires {
			if !l.Time.After(f.At) || (moves && l.Token <= f.Token) {
				continue
			}
			if first.IsZero() || l.Time.Before(first) {
				first = l.Time
			}
		}
		if !first.IsZero() {
			f.Gap = first.Sub(f.At)
			gaps[f.Kind] = append(gaps[f.Kind], f.Gap)
		}
		var elected time.Time
		for _, l := range elections {
			if l.Token > f.Token && l.Time.After(f.At) && (elected.IsZero() || l.Time.Before(elected)) {
				elected = l.Time
			}
		}
		if f.Kind == FaultShardPause && f.Elected > 0 {
			// Measured by the drill: every shard of the paused replica
			// led by another (any other shard's election says nothing).
			handovers[f.Kind] = append(handovers[f.Kind], f.Elected)
		} else if moves && !elected.IsZero() {
			f.Elected = elected.Sub(f.At)
			handovers[f.Kind] = append(handovers[f.Kind], f.Elected)
		}
	}
	rep.Faults = faults
	rep.FailoverGaps = map[string]Stats{}
	for k, g := range gaps {
		rep.FailoverGaps[k] = StatsOf(g)
	}
	rep.Handovers = map[string]Stats{}
	for k, g := range handovers {
		rep.Handovers[k] = StatsOf(g)
	}
}
