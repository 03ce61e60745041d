package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/broker"
	amqpbroker "github.com/beatd/beatd/broker/amqp"
	redisbroker "github.com/beatd/beatd/broker/redis"
	sqsbroker "github.com/beatd/beatd/broker/sqs"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/console"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/logbridge"
	"github.com/beatd/beatd/internal/termsafe"
	"github.com/beatd/beatd/internal/tlsfiles"
	"github.com/beatd/beatd/internal/version"
	"github.com/beatd/beatd/leader"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Serve runs the daemon until ctx ends, then stops it gracefully.
func (m *Main) Serve(ctx context.Context) int {
	setGCPercent()
	// go-redis and gRPC log through process-wide loggers: the process's
	// one daemon sets them, before any client exists.
	log := m.newLogger().With("id", m.ID)
	logbridge.SetRedisLogger(log)
	logbridge.SetGRPCLogger(log)
	if err := m.Run(ctx); err != nil {
		// A config that cannot run reads as `beatd validate` prints it:
		// one problem a line, on stderr.
		var ce *config.CheckError
		if errors.As(err, &ce) {
			fmt.Fprintln(m.stderr, termsafe.Text(ce.Error()))
			return 1 // nothing started, so nothing to stop
		}
		if ctx.Err() != nil {
			// SIGTERM while it waited (for etcd): a stop, not a failure.
			log.Info("stopped while starting", "reason", err.Error())
			_ = m.Close()
			return 0
		}
		log.Error("beatd failed to start", "errors", strings.Split(err.Error(), "\n"))
		_ = m.Close()
		return 1
	}
	// SIGHUP reloads the config; the first SIGINT/SIGTERM (ctx) starts a
	// graceful stop, a second one forces the exit.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for ctx.Err() == nil {
		select {
		case <-hup:
			m.Reload()
		case <-ctx.Done():
		}
	}
	force := make(chan os.Signal, 1)
	signal.Notify(force, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-force
		log.Warn("second signal, exiting now")
		os.Exit(1)
	}()
	if err := m.Close(); err != nil {
		log.Error("stop", "err", err)
		return 1
	}
	return 0
}

// Main is the beatd daemon: it wires config, etcd, Redis, the election,
// the scheduler and HTTP together.
type Main struct {
	Options
	// clock is the one clock the daemon's loops read and wait on.
	clock clockwork.Clock

	stdout, stderr io.Writer
	log            *slog.Logger
	embedded       *embedetcd.Server
	etcd           *clientv3.Client
	rdb            redis.UniversalClient
	pub            *redisbroker.Publisher
	resultsRDB     redis.UniversalClient // --result-backend
	brokerPass     string
	feed           *outcome.Feed
	started        time.Time
	brokerPing     func(context.Context) error
	store          *store.Store
	leader         *leader.Loop
	sched          *scheduler.Scheduler
	metrics        *scheduler.Metrics
	reloadMetrics  *reloadMetrics
	registry       *prometheus.Registry
	httpSrv        *http.Server
	// httpHandler is what httpSrv serves: startingHandler until the
	// daemon has started, then the API and console.
	httpHandler atomic.Pointer[http.Handler]
	// metricsHandler is what metricsSrv serves, the same way.
	metricsHandler atomic.Pointer[http.Handler]
	// apiUp is closed once the listeners serve the API (Run).
	apiUp chan struct{}
	// waitingFor is why the replica is not ready yet while it starts
	// (empty once it has started).
	waitingFor  atomic.Pointer[string]
	metricsSrv  *http.Server
	argvSecrets []string // flags whose value, given in argv, holds a password
	brokerHA    brokerHealth
	httpLn      net.Listener
	api         *backend
	adminToken  string
	tokens      *auth.Tokens
	console     *console.Server
	timeline    *console.Timeline
	merger      *sources.Merger
	entries     *sources.Entries
	// entriesRev is the revision the runtime entries were first read at:
	// their watch follows on from it.
	entriesRev int64

	// tune fits the process's runtime (GOGC, GOMAXPROCS) to the config's
	// size: tuneRuntime, or nothing where Main is not the process's only
	// tenant (tests run several in one process).
	tune func(entries int)
	// release returns the heap's free memory to the OS once a shard's
	// entries are loaded: returnMemory, or nothing where Main is not the
	// process's only tenant.
	release func()
	// lift raises the GC's growth while a shard's term starts: liftGC,
	// or nil where Main is not the process's only tenant.
	lift func() (restore func())

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	configSum [32]byte // of the config last loaded or tried; guarded by reloadMu
	reloadMu  sync.Mutex
	// fileData is, on a sharded replica, the bytes of the file the merger
	// runs (guarded by reloadMu): a shard's term parses its own entries
	// from them (config.CheckPart), so each is of the same file as the
	// others, whatever is on disk meanwhile.
	fileData  []byte
	closeOnce sync.Once
	ops       opsState
	runCtx    context.Context

	// shards runs the leadership of a cluster of more than one shard
	// (shards.go); nil for one shard, whose leader and sched run it.
	shards *shardSet
	// remoteConflicts are, on a sharded replica, the conflicts of runtime
	// entries of the shards it does not lead (Main.conflicts).
	remoteConflicts atomic.Pointer[[]sources.Conflict]
	// shardTimelines are the console's timelines of each shard's fires
	// on this replica, by shard (shardObserver).
	shardTimelines []*console.Timeline
}

// Options is what a replica is told: run's flags and their environment
// variables, parsed and checked before anything starts.
type Options struct {
	ConfigPath     string
	Etcd           etcdflags.Flags
	Cluster        clusterFlags
	DataDir        string
	EtcdClientPort int
	EtcdPeerPort   int
	Broker         string
	BrokerMaster   string
	BrokerPassFile string
	KombuPrefix    string
	MinReplicas    int
	MinReplicasTO  time.Duration
	RedisPrefix    string
	DedupTTL       time.Duration
	TriggerTTL     time.Duration
	ID             string
	LeaseTTL       time.Duration
	HTTPAddr       string
	// HTTPTLSCert and HTTPTLSKey serve HTTPS (read again when they
	// change); HTTPTLSCA verifies the other replicas' HTTPS. MetricsHTTP
	// is a plain listener for probes and metrics only.
	HTTPTLSCert string
	HTTPTLSKey  string
	HTTPTLSCA   string
	MetricsHTTP string
	// HTTPTimeouts bound both HTTP servers' connections (zero: defaults).
	HTTPTimeouts HTTPTimeouts
	// BrokerFailoverAfter is how long a leader's path to the broker may
	// fail, while a standby reaches it, before it hands over (0: twice
	// the lease TTL).
	BrokerFailoverAfter time.Duration
	LogFormat           string
	LogLevel            string
	AdminTokenFile      string
	// TokensFile names the tokens (name → role and SHA-256); RequireNotes
	// refuses a pause without a note; AuditKeep bounds the audit trail.
	TokensFile    string
	RequireNotes  bool
	AuditKeep     int
	StateInterval time.Duration
	RunHistory    int
	LogFires      int
	EtcdCompact   time.Duration
	EtcdQuota     int64
	EtcdMaxTxnOps int
	// ClockOffsetWarn: /status and the log warn when this replica's
	// clock is off etcd's by more (0: never).
	ClockOffsetWarn time.Duration
	EtcdRetention   string
	AdvertiseURL    string
	// MinInterval is the shortest every: accepted, in the file and in
	// runtime entries (0: config.DefaultMinInterval).
	MinInterval time.Duration
	// Shards is the cluster's shard count (1: unsharded), fixed when the
	// cluster is made (shards.go).
	Shards int
	// Park starts the replica parked: its embedded etcd member only
	// (park.go), for an offline resize of the embedded topology.
	Park bool
	// ShardDrain bounds a sharded replica's drain at SIGTERM
	// (shardSet.drain): how long it waits for others to load its shards.
	ShardDrain time.Duration

	metricsPerEntryLimit int
	Sources              sourceFlags
	Outcomes             outcomeFlags
}

// DefaultStateInterval is how often the leader writes the entries' state
// at most. Each write puts every bucket a changed entry hashes to (256 of
// them once a few thousand entries fire), so at 1,000 entries `every: 1s`
// writing each second was a fifth to a third of beatd's CPU per fire with its
// embedded etcd. A longer interval loses nothing: Redis's marks make a
// failover's re-publish of the unwritten slots a no-op, catchup: once
// re-publishes one slot per entry whatever the interval, and the AMQP
// path writes after each batch anyway.
const DefaultStateInterval = 5 * time.Second

// NewMain returns a Main with the defaults.
func NewMain(stdout, stderr io.Writer) *Main {
	host, _ := os.Hostname()
	return &Main{
		clock: clockwork.NewRealClock(), Options: Options{ConfigPath: "schedules.yaml", DataDir: "./beatd-data", EtcdClientPort: 2379, EtcdPeerPort: 2380,
			Broker: "redis://127.0.0.1:6379/0", ID: host, LeaseTTL: election.DefaultTTL, HTTPAddr: DefaultHTTPAddr,
			LogFormat: "json", LogLevel: "info", Etcd: etcdflags.Flags{Prefix: keys.DefaultPrefix},
			StateInterval: DefaultStateInterval, RunHistory: redisbroker.DefaultHistory, LogFires: scheduler.DefaultFireLogLimit,
			EtcdQuota: embedetcd.DefaultQuotaBackendBytes, EtcdMaxTxnOps: store.MaxOpsPerTxn, ClockOffsetWarn: time.Second, EtcdRetention: embedetcd.DefaultCompactionRetention,
			MinReplicas: minReplicasUnset, MinReplicasTO: redisbroker.DefaultReplicasTimeout, Shards: 1,
			ShardDrain: shardDrainBudget},
		stdout: stdout, stderr: stderr, ops: opsState{kick: make(chan struct{}, 1)}, tune: tuneRuntime,
		release: returnMemory, lift: liftGC,
	}
}

// ParseFlags reads flags, then BEATD_* environment variables for flags not
// given.
func (m *Main) ParseFlags(_ context.Context, args []string) error {
	fs := m.Flags()
	if err := flagenv.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	m.NoteArgvSecrets(fs)
	return m.CheckFlags()
}

// Flags registers run's flags on a new FlagSet.
func (m *Main) Flags() *pflag.FlagSet {
	fs := flagenv.New("run", m.stderr)
	fs.StringVar(&m.ConfigPath, "config", m.ConfigPath, "schedule file; reloaded on SIGHUP and on change")
	m.Etcd.Register(fs)
	m.Cluster.register(fs)
	fs.StringVar(&m.DataDir, "data-dir", m.DataDir, "embedded etcd's data directory (without --etcd-endpoints)")
	fs.IntVar(&m.EtcdClientPort, "etcd-client-port", m.EtcdClientPort, "embedded etcd's client port on 127.0.0.1")
	fs.IntVar(&m.EtcdPeerPort, "etcd-peer-port", m.EtcdPeerPort, "embedded etcd's peer port on 127.0.0.1")
	fs.StringVar(&m.Broker, "broker", m.Broker, "Celery broker URL: redis://, rediss://, unix://, sentinel://, RabbitMQ: amqp://, amqps://, pyamqp://, librabbitmq://, or Amazon SQS: sqs:// (docs/brokers.md). "+amqpbroker.AMQPWindow+" "+sqsbroker.Window)
	fs.StringVar(&m.BrokerMaster, "broker-master-name", "", "Redis Sentinel master name")
	fs.StringVar(&m.BrokerPassFile, "broker-password-file", "", "file holding the Redis password (else BEATD_BROKER_PASSWORD)")
	fs.StringVar(&m.KombuPrefix, "broker-key-prefix", "", "Kombu's global_keyprefix, if the workers use one")
	fs.IntVar(&m.MinReplicas, "broker-min-replicas", m.MinReplicas, "replicas that must hold each publish (WAIT) before it counts as done; default 1 for sentinel:// when the master has a replica, else 0")
	fs.DurationVar(&m.MinReplicasTO, "broker-min-replicas-timeout", m.MinReplicasTO, "how long each publish waits for --broker-min-replicas; on a shortfall the slots stay pending and are retried")
	fs.StringVar(&m.RedisPrefix, "redis-prefix", "", "prefix of beatd's own Redis keys (default beatd:{<prefix>}:)")
	fs.DurationVar(&m.DedupTTL, "dedup-ttl", 0, "the previous release's per-fire dedup key lifetime, as it was set there: after an upgrade those keys are honoured this long (default max(7 days, the longest catchup_window))")
	fs.DurationVar(&m.TriggerTTL, "trigger-ttl", redisbroker.DefaultTriggerTTL, "how long Redis remembers a manual trigger as published (one small key per trigger)")
	fs.StringVar(&m.ID, "id", m.ID, "this replica's name (default: the hostname)")
	fs.DurationVar(&m.LeaseTTL, "lease-ttl", m.LeaseTTL, "etcd lease TTL: how long a dead leader holds on")
	fs.StringVar(&m.HTTPAddr, "http", m.HTTPAddr, "HTTP listen address for health, metrics, status, the console and admin; loopback unless set (:8080 for every interface, as pods and other hosts need)")
	fs.DurationVar(&m.BrokerFailoverAfter, "broker-failover-after", 0, "a leader that has not reached the broker for this long, while a standby reaches it, hands leadership to that standby (default twice --lease-ttl); a broker down for every replica causes no handover")
	fs.StringVar(&m.HTTPTLSCert, "http-tls-cert", "", "serve --http as HTTPS with this certificate (PEM; read again when it changes, as cert-manager rotates it)")
	fs.StringVar(&m.HTTPTLSKey, "http-tls-key", "", "the key of --http-tls-cert")
	fs.StringVar(&m.HTTPTLSCA, "http-tls-ca", "", "CA that signs the replicas' HTTPS certificates, to verify another replica's (the console reads the leader's); default the system's")
	fs.StringVar(&m.MetricsHTTP, "metrics-http", "", "also serve /healthz, /readyz and /metrics, and nothing else, on this plain-HTTP address (e.g. :9090 for probes and Prometheus next to an HTTPS --http)")
	fs.StringVar(&m.LogFormat, "log-format", m.LogFormat, "json or text")
	fs.StringVar(&m.LogLevel, "log-level", m.LogLevel, "debug, info, warn or error")
	fs.StringVar(&m.AdminTokenFile, "admin-token-file", "", "file holding the admin bearer token (else BEATD_ADMIN_TOKEN); without one the admin endpoints are disabled")
	fs.StringVar(&m.TokensFile, "tokens-file", "", "file of named bearer tokens with roles (read, operate, admin), each stored as its SHA-256 (beatd token new makes one); reloaded on change")
	fs.BoolVar(&m.RequireNotes, "require-notes", false, "refuse a pause that gives no note saying why")
	fs.IntVar(&m.AuditKeep, "audit-keep", store.DefaultAuditKeep, "audit records kept in etcd; the oldest go past it")
	fs.DurationVar(&m.StateInterval, "state-interval", m.StateInterval, "the most often each entry's state is written to etcd; a failover re-publishes (deduplicated) what was fired since")
	fs.IntVar(&m.RunHistory, "run-history", m.RunHistory, "runs each entry keeps in Redis for status (0 keeps none)")
	fs.IntVar(&m.LogFires, "log-fires", m.LogFires, "per-fire INFO lines a second before they are summarised in one line a second (0: no per-fire lines)")
	fs.DurationVar(&m.EtcdCompact, "etcd-compact", 0, "with --etcd-endpoints: the leader compacts etcd's history to this age (cluster-wide: off by default; the embedded etcd compacts itself)")
	fs.Int64Var(&m.EtcdQuota, "etcd-quota-backend-bytes", m.EtcdQuota, "the embedded etcd's backend quota")
	fs.DurationVar(&m.ClockOffsetWarn, "clock-offset-warn", m.ClockOffsetWarn, "warn (in /status and the log) when this replica's wall clock is off etcd's by more than this: slots fire by the leader's clock (0: never)")
	fs.IntVar(&m.EtcdMaxTxnOps, "etcd-max-txn-ops", m.EtcdMaxTxnOps, "etcd's --max-txn-ops: the embedded etcd's, or the one --etcd-endpoints runs with; beatd's transactions (state writes, an entries apply) stay within it")
	fs.StringVar(&m.EtcdRetention, "etcd-auto-compaction-retention", m.EtcdRetention, "the embedded etcd's periodic auto-compaction retention")
	fs.StringVar(&m.AdvertiseURL, "advertise-url", "", "base URL where other hosts reach this replica's HTTP, for `beatd status` (default: http://HOST:PORT of --http, the hostname if it listens on all addresses)")
	fs.DurationVar(&m.MinInterval, "min-interval", config.DefaultMinInterval, config.MinIntervalUsage)
	fs.IntVar(&m.Shards, "shards", m.Shards, "the cluster's shard count, fixed when the cluster is made: each shard has its own leader, and each replica leads a share (1: one leader, as before; docs/shards.md)")
	fs.DurationVar(&m.ShardDrain, "shard-drain-timeout", shardDrainBudget, "with --shards: how long SIGTERM waits for the other replicas to load this replica's shards before it lets the rest go (each then loads after winning); keep terminationGracePeriodSeconds ~20 s above it (docs/shards.md)")
	fs.BoolVar(&m.Park, "park", false, "run this replica's embedded etcd member only: no election, registration, publish or control request, and no shard count check (it starts while a resize runs); for `beatd shards resize` on the embedded topology (docs/shards.md)")
	fs.IntVar(&m.metricsPerEntryLimit, "metrics-per-entry-limit", scheduler.DefaultPerEntryLimit, "export per-entry metric series only up to this many entries; past it, aggregates only")
	m.Sources.register(fs)
	fs.StringVar(&m.Outcomes.ResultBackend, "result-backend", "", "Celery's result backend (redis:// and the other --broker forms), read for run outcomes the task events miss")
	fs.BoolVar(&m.Outcomes.TaskEvents, "task-events", true, "read the workers' task events (celery worker -E) from the broker for run outcomes")
	fs.BoolVar(&m.Outcomes.SendSentEvents, "send-task-events", false, "publish a task-sent event for each message (Redis), so Flower and `celery events` show beatd's sends")
	fs.DurationVar(&m.Outcomes.Silence, "outcome-silence", DefaultOutcomeSilence, "how long without any task event or result before status and the log say no outcome source is seen")
	return fs
}

// NoteArgvSecrets remembers, for a warning at start, the flags given on
// the command line whose value holds a password (a URL's user info): a
// command line is readable by every local user and in the pod spec,
// where a file or the environment is not.
func (m *Main) NoteArgvSecrets(fs *pflag.FlagSet) {
	for _, name := range []string{"broker", "result-backend", "etcd-endpoints"} {
		f := fs.Lookup(name)
		if f == nil || !flagenv.FromArgs(fs, name) {
			continue
		}
		for _, v := range strings.Split(f.Value.String(), ",") {
			if u, err := url.Parse(strings.TrimSpace(v)); err == nil && u.User != nil {
				if _, ok := u.User.Password(); ok {
					m.argvSecrets = append(m.argvSecrets, "--"+name)
					break
				}
			}
		}
	}
}

// CheckFlags validates the parsed flags.
func (m *Main) CheckFlags() error {
	if err := m.checkClusterFlags(); err != nil {
		return err
	}
	if err := checkShardsFlag(m.Shards); err != nil {
		return err
	}
	if m.ShardDrain < 0 || m.ShardDrain > maxShardDrain {
		return fmt.Errorf("--shard-drain-timeout must be between 0 and %s, not %s", maxShardDrain, m.ShardDrain)
	}
	if err := m.checkParkFlags(); err != nil {
		return err
	}
	if err := config.CheckMinInterval(m.MinInterval); err != nil {
		return fmt.Errorf("--min-interval: %w", err)
	}
	if m.LogFormat != "json" && m.LogFormat != "text" {
		return fmt.Errorf("--log-format must be json or text, not %q", m.LogFormat)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(m.LogLevel)); err != nil {
		return fmt.Errorf("--log-level must be debug, info, warn or error, not %q", m.LogLevel)
	}
	now := m.clock.Now()
	if err := tlsfiles.Check(m.Etcd.Cert, m.Etcd.Key, m.Etcd.CACert, now); err != nil {
		return fmt.Errorf("etcd client TLS: %w", err)
	}
	if m.HTTPTLSCert != "" || m.HTTPTLSKey != "" {
		if _, err := tlsfiles.CheckPair(m.HTTPTLSCert, m.HTTPTLSKey, now); err != nil {
			return fmt.Errorf("--http-tls-cert: %w", err)
		}
	}
	if err := tlsfiles.CheckCA(m.HTTPTLSCA); err != nil {
		return fmt.Errorf("--http-tls-ca: %w", err)
	}
	return nil
}

func (m *Main) newLogger() *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(m.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if m.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(m.stdout, opts))
	}
	return slog.New(slog.NewJSONHandler(m.stdout, opts))
}

// Run starts the daemon and returns once it is serving; Close stops it.
func (m *Main) Run(ctx context.Context) error {
	m.log = m.newLogger().With("id", m.ID)
	m.started = m.clock.Now()
	m.feed = outcome.NewFeed(m.clock, feedBuffer)
	prefix := m.Etcd.KeyPrefix()
	cluster := keys.Cluster(prefix)
	if m.Park {
		return m.runParked(ctx, prefix)
	}
	// The config file is checked before anything starts: a file that
	// cannot run fails at once, as `beatd validate` says, with no etcd
	// member, listener or goroutine to stop.
	cfg, err := m.loadConfig()
	if err != nil {
		return err
	}
	// The whole file: a sharded replica's merged config holds the
	// entries of the shards it leads alone.
	fileCfg := cfg
	m.configSum = fileSum(m.ConfigPath)
	if err := m.connectEtcd(ctx); err != nil {
		return err
	}
	if err := checkShardCount(ctx, m.etcd, prefix, m.Shards); err != nil {
		return err
	}
	if cfg, err = m.startSources(ctx, cfg); err != nil {
		return err
	}
	// After every source is read: a schedules.yaml of a few entries with
	// a million runtime entries is a large config.
	m.tune(len(cfg.Entries))

	brokerPass, err := etcdflags.Secret(m.BrokerPassFile, "BEATD_BROKER_PASSWORD")
	if err != nil {
		return err
	}
	m.brokerPass = brokerPass
	m.registry = prometheus.NewRegistry()
	var pub scheduler.Dispatcher
	minReplicas, err := brokerMinReplicas(m.MinReplicas, m.Broker)
	if err != nil {
		return err
	}
	var amqpOpts amqpbroker.AMQPOptions
	if sqsbroker.IsSQSURL(m.Broker) {
		if m.Shards > 1 {
			// The send records and their fence are the cluster's, not a
			// shard's: a sharded cluster on SQS would fence one shard's
			// sends with another's term.
			return fmt.Errorf("--shards %d: the SQS broker runs unsharded clusters only (--shards 1)", m.Shards)
		}
		s, err := m.newSQS(ctx, prefix, probeTasks(cfg, cluster, m.KombuPrefix))
		if err != nil {
			return err
		}
		pub, m.brokerPing = s, s.Ping
	} else if amqpbroker.IsAMQPURL(m.Broker) {
		amqpOpts = amqpbroker.AMQPOptions{URL: m.Broker, Password: brokerPass, Cluster: cluster, Clock: m.clock,
			Verify: amqpVerify(m.etcd, prefix), Queues: m.amqpQueues,
			Registerer: m.registry, Logger: m.log}
		a, err := amqpbroker.NewAMQP(amqpOpts)
		if err != nil {
			return err
		}
		pub, m.brokerPing = a, a.Ping
	} else if m.rdb, err = redisbroker.NewClient(redisbroker.BrokerConfig{URL: m.Broker, MasterName: m.BrokerMaster, Password: brokerPass,
		ReadTimeout: max(3*time.Second, m.MinReplicasTO+2*time.Second)}); err != nil {
		return err
	}
	dedup := m.DedupTTL
	if dedup <= 0 {
		var whole *config.Config
		if m.Shards > 1 {
			whole = fileCfg
		}
		dedup = dedupFor(cfg, whole, m.Sources.dcb != nil)
	}
	shortfalls := newShortfallCounter()
	var redisOpts redisbroker.Options
	if pub == nil {
		redisOpts = redisbroker.Options{Cluster: cluster, KeyPrefix: keys.RedisPrefix(m.RedisPrefix, cluster), DedupTTL: dedup, Clock: m.clock,
			TriggerTTL: m.TriggerTTL, History: noneIfZero(m.RunHistory), MinReplicas: minReplicas, MinReplicasTimeout: m.MinReplicasTO, ReplicaShortfalls: shortfalls,
			SentEventsFrom: m.sentEventsFrom(), SentEventsDB: clientDB(m.rdb), Scratch: redisbroker.NewScratch()}
		m.pub = redisbroker.New(m.rdb, redisOpts)
		probed := cfg
		if m.Shards > 1 {
			probed = fileCfg
		}
		if err := probeBroker(ctx, m.log, m.pub, m.Broker, probeTasks(probed, cluster, m.KombuPrefix)); err != nil {
			return err
		}
		pub = m.pub
		m.brokerPing = func(ctx context.Context) error { return m.rdb.Ping(ctx).Err() }
	}

	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(m.merger.Collectors()...)
	m.metrics = m.newMetrics()
	m.reloadMetrics = newReloadMetrics(m.registry)
	m.registry.MustRegister(shortfalls)
	m.registry.MustRegister(m.feed.Collectors()...)
	// Redis's marks never expire, so no state backlog is dangerous there;
	// the AMQP path keeps its journal's horizon.
	backlogHorizon := time.Duration(0)
	if m.pub != nil {
		m.registry.MustRegister(m.pub.FootprintCollector())
	} else {
		backlogHorizon = dedup
	}
	host, _ := os.Hostname()
	m.timeline = console.NewTimeline(m.clock.Now)
	schedCfg := scheduler.Config{Clock: m.clock, Dispatcher: pub, Store: m.store, Logger: m.log, Metrics: m.metrics,
		Cluster: cluster, Origin: "beatd@" + host, KombuPrefix: m.KombuPrefix,
		StateInterval: m.StateInterval, DedupTTL: backlogHorizon, PersistEachBatch: persistEachBatch(m.Broker), BatchSize: batchFor(m.Broker),
		FireLogLimit: noneIfZero(m.LogFires), Observer: m.observeFire, Outcomes: m.feed, FirstSeen: m.merger.FirstSeen}
	m.sched, err = scheduler.New(schedCfg, cfg)
	if err != nil {
		return err
	}
	if m.Shards > 1 {
		if m.shards, err = m.newShards(cfg, schedCfg, redisOpts, amqpOpts); err != nil {
			return err
		}
	}
	m.configAccepted(m.configuredEntries(cfg))
	elector, err := election.New(election.Config{Client: m.etcd, Prefix: prefix, ID: m.ID, TTL: m.LeaseTTL, Logger: m.log, Clock: m.clock})
	if err != nil {
		return err
	}
	m.brokerHA.handovers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "beatd_leader_handovers_total",
		Help: "Terms this replica handed over while it could still lead, by reason (broker_unreachable: its path to the broker failed while a standby's worked)."}, []string{"reason"})
	m.brokerHA.handovers.WithLabelValues("broker_unreachable")
	m.registry.MustRegister(m.brokerHA.handovers)
	if m.leader, err = leader.New(leader.Config{Clock: m.clock, Elector: leader.Etcd(elector), Lead: m.leadTerm,
		Registerer: m.registry, CampaignErrors: m.metrics.EtcdErrors, Logger: m.log, Hold: m.electionHold}); err != nil {
		return err
	}

	if m.tokens, err = auth.New(auth.Options{File: m.TokensFile, Admin: m.adminToken, Read: m.Sources.readToken, Logger: m.log, Now: m.clock.Now}); err != nil {
		return err
	}
	if m.console, err = m.newConsole(); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel, m.runCtx = cancel, runCtx
	m.api = &backend{id: m.ID, clock: m.clock, ctx: runCtx, etcd: m.etcd, prefix: prefix, endpoints: m.Etcd.Endpoints, store: m.store,
		leader: m.leader, sched: m.sched, config: m.runningConfig, entry: m.entryOf, pub: m.pub, ping: m.brokerCheck, merger: m.merger, metrics: m.metrics,
		feed: m.feed, outcomes: m.Outcomes, started: m.started, shards: m.shards}
	etcdTLS, err := m.Etcd.TLSConfig()
	if err != nil {
		cancel()
		return err
	}
	if m.api.peers, err = m.replicaHTTP(); err != nil {
		cancel()
		return err
	}
	if m.Shards > 1 {
		m.api.remote, m.api.conflicts = m.remoteEntries, m.conflicts
	}
	m.api.clockOff = newClockOffset(m.clock, m.Etcd.EndpointURLs(), etcdTLS, m.ClockOffsetWarn, m.log.With("component", "clock"))
	m.registry.MustRegister(m.api.clockOff.gauge)
	apiCfg := api.Config{Backend: m.api, Gatherer: m.registry, Tokens: m.tokens, Logger: m.log,
		Entries: m.entriesAPI(), Ops: m.api, RequireNotes: m.RequireNotes, Now: m.clock.Now, ApplyLimit: m.EtcdMaxTxnOps}
	if m.shards != nil {
		apiCfg.Live = m.shards
	}
	// The listeners (listenHTTP) now serve the API and the probes.
	m.setHandler(m.console.Handler(api.Handler(apiCfg)))
	if m.metricsSrv != nil {
		m.setMetricsHandler(console.Secure(api.ProbeHandler(apiCfg)))
	}
	close(m.apiUp)
	m.watchUnauthenticated(runCtx)
	m.wg.Go(func() { m.watchBroker(runCtx) })
	m.wg.Go(func() { m.api.clockOff.run(runCtx) })
	m.startOps(runCtx)
	m.syncSources(runCtx)
	if err := m.startOutcomes(runCtx); err != nil {
		cancel()
		return err
	}
	m.wg.Add(4)
	go func() { defer m.wg.Done(); m.console.Run(runCtx) }()
	go func() { defer m.wg.Done(); m.register(runCtx) }()
	go func() {
		defer m.wg.Done()
		if m.shards != nil {
			var watchdog sync.WaitGroup
			watchdog.Go(func() { m.shardBrokerWatchdog(runCtx) })
			m.shards.Run(runCtx)
			watchdog.Wait()
			return
		}
		m.leader.Run(runCtx)
	}()
	go func() {
		defer m.wg.Done()
		m.watchConfig(runCtx)
	}()
	for _, f := range m.argvSecrets {
		m.log.Warn("a password was given in "+f+" on the command line, where every local user (ps, /proc) and the pod spec can read it: "+
			"put the URL in "+flagenv.EnvName(strings.TrimPrefix(f, "--"))+" instead, or the password in its password file", "flag", f)
	}
	m.log.Info("beatd started", "config", m.ConfigPath, "entries", m.configuredEntries(cfg), "broker", broker.Redacted(m.Broker),
		"etcd", m.Etcd.Endpoints, "prefix", prefix, "http", m.httpLn.Addr().String(), "lease_ttl", m.LeaseTTL.String(), "version", version.String())
	return nil
}

// connectEtcd starts the embedded etcd member (without --etcd-endpoints),
// connects to etcd, opens the HTTP listeners (probes answer while it
// waits) and waits until etcd answers: what a replica and a parked one
// both do before anything else.
func (m *Main) connectEtcd(ctx context.Context) error {
	var err error
	prefix := m.Etcd.KeyPrefix()
	type started struct {
		srv *embedetcd.Server
		err error
	}
	var etcdc chan started
	if len(m.Etcd.EndpointURLs()) == 0 {
		m.logEmbedded()
		if err := os.MkdirAll(m.DataDir, 0o700); err != nil {
			m.dataDirFailed(err)
			return fmt.Errorf("data dir: %w", err)
		}
		etcdc = make(chan started, 1)
		go func() {
			ec := m.embedConfig(ctx)
			ec.Logger, ec.QuotaBackendBytes, ec.CompactionRetention = m.log, m.EtcdQuota, m.EtcdRetention
			ec.MaxTxnOps = m.EtcdMaxTxnOps
			srv, err := embedetcd.Start(ec)
			etcdc <- started{srv, err}
		}()
	}
	if etcdc != nil {
		s := <-etcdc
		if s.err != nil {
			m.dataDirFailed(s.err)
			return s.err
		}
		m.embedded = s.srv
		m.Etcd.Endpoints = strings.Join(s.srv.Endpoints, ",")
	}
	if m.adminToken, err = etcdflags.Secret(m.AdminTokenFile, "BEATD_ADMIN_TOKEN"); err != nil {
		return err
	}
	if m.etcd, err = m.Etcd.Client(); err != nil {
		return err
	}
	m.store = store.New(m.etcd, prefix).WithMaxOps(m.EtcdMaxTxnOps).WithClock(m.clock)
	m.store.SetAuditKeep(m.AuditKeep)
	// HTTP is up while beatd waits for etcd: /healthz says the process
	// lives, /readyz says what it waits for.
	if err := m.listenHTTP(); err != nil {
		return err
	}
	return m.waitEtcd(ctx)
}

// newMetrics registers the replica's scheduler metrics. On a sharded
// replica each shard's loop exports its own, labelled with its shard
// (newShardSet), so these, which no loop fires (m.sched only holds the
// config there) and which only the probes' error counts reach, are
// shard="": the one registry holds each name with one set of label names.
// They are aggregate only (a limit of 1), so the entries' series are the
// shards' alone.
func (m *Main) newMetrics() *scheduler.Metrics {
	if m.Shards <= 1 {
		mt := scheduler.NewMetrics(m.registry)
		mt.PerEntryLimit = m.metricsPerEntryLimit
		return mt
	}
	mt := scheduler.NewMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"shard": ""}, m.registry))
	mt.PerEntryLimit = 1
	return mt
}

// Shutdown budgets. A standby's SIGTERM exits within about a second in
// every topology: each step that waits on something outside the process
// (HTTP clients, etcd answering a lease revoke, etcd's raft leadership
// transfer and close) gets what is left of stopBudget, and a step that
// runs out is skipped, with an INFO line saying what and why. A leader
// waits for its handover (the resign, bounded in leader) before the
// budget applies to the rest.
const (
	stopBudget = 900 * time.Millisecond
	// httpStopBudget is how long open HTTP requests (a console's event
	// stream, a slow /status) may take to finish before they are cut.
	httpStopBudget = 300 * time.Millisecond
	// minEmbeddedCloseBudget is the least the embedded member gets, even
	// after a leader's long handover.
	minEmbeddedCloseBudget = 200 * time.Millisecond
)

// HTTPAddress is where the HTTP server listens (useful with --http :0).
func (m *Main) HTTPAddress() string { return m.httpLn.Addr().String() }

// leadTerm is the leader's work for one term: the scheduler, plus the
// term's side jobs, which stop before the term is resigned.
func (m *Main) leadTerm(ctx context.Context, t leader.Term) error {
	var compacting sync.WaitGroup
	compactCtx, stopCompact := context.WithCancel(ctx)
	if m.EtcdCompact > 0 && m.embedded == nil {
		compacting.Go(func() { m.store.Compact(compactCtx, m.EtcdCompact, m.log) })
	}
	stopCatalog := m.publishCatalog(t)
	stopAvoid := m.avoidRaftLeader(ctx)
	ctx, endTerm := context.WithCancelCause(ctx)
	defer endTerm(nil)
	var watchdog sync.WaitGroup
	watchdog.Go(func() { m.brokerWatchdog(ctx, t.Resign, endTerm) })
	err := m.sched.Run(ctx, t.Term)
	endTerm(nil)
	watchdog.Wait()
	if cause := context.Cause(ctx); errors.Is(cause, errBrokerHandover) {
		err = cause
	}
	stopAvoid()
	stopCatalog()
	stopCompact()
	compacting.Wait()
	return err
}

// Close stops the daemon gracefully: the loop finishes its publish in
// flight and persists it, the replica resigns so a standby leads at once,
// then everything shuts down, within stopBudget past the handover.
func (m *Main) Close() error {
	var err error
	m.closeOnce.Do(func() {
		// The stop budget is kept on the OS's time, not the daemon's
		// clock: it races the orchestrator's kill after its grace period
		// and bounds HTTP shutdowns by context deadlines, both real time.
		if m.shards != nil && m.cancel != nil {
			// Each shard to a replica that has loaded it, before the
			// stop lets the rest go (shardSet.drain).
			m.shards.drain(context.Background(), m.ShardDrain)
		}
		start := time.Now()
		leading := m.leader != nil && m.leader.Token() != 0 || m.shards != nil && m.shards.held() > 0
		if m.cancel != nil {
			m.cancel()
		}
		var skipped []string
		for _, srv := range []*http.Server{m.httpSrv, m.metricsSrv} {
			if srv == nil {
				continue
			}
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(httpStopBudget))
			if srv.Shutdown(ctx) != nil {
				_ = srv.Close()
				skipped = appendOnce(skipped, "open HTTP requests (cut)")
			}
			cancel()
		}
		// A leader's goroutines end with its handover, which is worth
		// its wait (bounded in leader). A standby's wait only on etcd
		// answering a lease revoke, which the leases' TTL makes moot: past
		// the budget, closing the client ends them.
		waitStart := time.Now()
		if leading {
			m.wg.Wait()
		} else if !waitWithin(&m.wg, time.Until(start.Add(stopBudget))) {
			skipped = append(skipped, "lease revokes etcd had not answered (the leases expire within their TTL)")
			if m.etcd != nil {
				err = errors.Join(err, m.etcd.Close())
			}
			m.wg.Wait() // prompt: the client's calls end with it
		}
		m.ops.wg.Wait()
		if m.api != nil {
			m.api.status.wg.Wait()
		}
		if m.rdb != nil {
			err = errors.Join(err, m.rdb.Close())
		}
		if m.resultsRDB != nil {
			err = errors.Join(err, m.resultsRDB.Close())
		}
		if m.etcd != nil {
			err = errors.Join(err, m.etcd.Close())
		}
		if m.embedded != nil && m.Cluster.InitialCluster != "" {
			// A member of the replicas' cluster: the process is exiting,
			// so its close is bounded (embedetcd.CloseWithin says why).
			budget := max(time.Until(start.Add(stopBudget)), minEmbeddedCloseBudget)
			if leading {
				budget = max(stopBudget-time.Since(waitStart), minEmbeddedCloseBudget)
			}
			for _, step := range m.embedded.CloseWithin(budget) {
				skipped = append(skipped, "embedded etcd "+step+" (its data is in its WAL; the other members elect a raft leader)")
			}
		} else if m.embedded != nil {
			m.embedded.Close()
		}
		if m.log != nil {
			if len(skipped) > 0 {
				m.log.Info("stopped without waiting for what had not finished within the stop budget",
					"skipped", skipped, "budget", stopBudget.String(), "took", time.Since(start).Round(time.Millisecond).String())
			}
			m.log.Info("beatd stopped", "took", time.Since(start).Round(time.Millisecond).String())
		}
	})
	return err
}

// waitWithin waits for wg up to d and reports whether it finished. The
// waiting goroutine ends with wg, which the caller still waits for. d is
// part of Close's stop budget, so it is OS time (Close says why).
func waitWithin(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func appendOnce(list []string, s string) []string {
	for _, v := range list {
		if v == s {
			return list
		}
	}
	return append(list, s)
}

// noneIfZero maps a flag's "0 turns it off" to the options' "negative
// turns it off" (where zero means the default).
func noneIfZero(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// amqpQueues is how the running schedule says queues are declared.
func (m *Main) amqpQueues() amqpbroker.Queues {
	if c := m.runningConfig(); c != nil {
		return c.AMQP
	}
	return nil
}

// amqpVerify is the etcd half of the AMQP fence: election says whether
// the term is still the current one, and a deposed term is the broker's
// ErrStale. It lives here, in the wiring, so no broker imports election.
func amqpVerify(cli *clientv3.Client, prefix string) func(ctx context.Context, token int64) error {
	return func(ctx context.Context, token int64) error {
		err := election.CheckCurrent(ctx, cli, prefix, token)
		if errors.Is(err, election.ErrDeposed) {
			return fmt.Errorf("%w: %w", broker.ErrStale, err)
		}
		return err
	}
}

// Both transports are the scheduler's Dispatcher; Redis also forgets the
// keys of entries gone for good.
var (
	_ scheduler.Dispatcher = (*redisbroker.Publisher)(nil)
	_ scheduler.Dispatcher = (*amqpbroker.AMQP)(nil)
	_ scheduler.Dispatcher = (*sqsbroker.SQS)(nil)
	_ scheduler.Forgetter  = (*redisbroker.Publisher)(nil)
)

// amqpBatch is the publish batch on RabbitMQ: its journal keeps 256
// records of a batch's task ids, which stays within ~5 MB at 512 fires a
// batch. Redis takes the scheduler's default (2,048).
const amqpBatch = 512

// sqsBatch is the publish batch on SQS: each batch's messages are
// written to etcd before they are sent, about 1.5 KB a fire, so a batch
// stays well within etcd's request limit.
const sqsBatch = 256

func batchFor(brokerURL string) int {
	switch {
	case amqpbroker.IsAMQPURL(brokerURL):
		return amqpBatch
	case sqsbroker.IsSQSURL(brokerURL):
		return sqsBatch
	}
	return 0
}

// persistEachBatch is whether the scheduler writes its state after every
// batch: the brokers that deduplicate against a bounded journal of recent
// batches (RabbitMQ, SQS) need it to trail by at most a batch or two.
func persistEachBatch(brokerURL string) bool {
	return amqpbroker.IsAMQPURL(brokerURL) || sqsbroker.IsSQSURL(brokerURL)
}
