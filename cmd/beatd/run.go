package main

import (
	"context"
	"crypto/sha256"
	"errors"

	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/publisher"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	setGCPercent()
	m := NewMain(stdout, stderr)
	if err := m.ParseFlags(ctx, args); err != nil {
		return exitCode(err)
	}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintln(stderr, "beatd:", err)
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
		fmt.Fprintln(stderr, "beatd: second signal, exiting now")
		os.Exit(1)
	}()
	if err := m.Close(); err != nil {
		fmt.Fprintln(stderr, "beatd:", err)
		return 1
	}
	return 0
}

// Main is the beatd daemon: it wires config, etcd, Redis, the election,
// the scheduler and HTTP together.
type Main struct {
	ConfigPath     string
	Etcd           etcdFlags
	Cluster        clusterFlags
	DataDir        string
	EtcdClientPort int
	EtcdPeerPort   int
	Broker         string
	BrokerMaster   string
	BrokerPassFile string
	KombuPrefix    string
	RedisPrefix    string
	DedupTTL       time.Duration
	ID             string
	LeaseTTL       time.Duration
	HTTPAddr       string
	LogFormat      string
	LogLevel       string
	AdminTokenFile string

	stdout, stderr io.Writer
	log            *slog.Logger
	embedded       *embedetcd.Server
	etcd           *clientv3.Client
	rdb            redis.UniversalClient
	store          *store.Store
	elector        *election.Elector
	sched          *scheduler.Scheduler
	metrics        *scheduler.Metrics
	registry       *prometheus.Registry
	httpSrv        *http.Server
	httpLn         net.Listener
	adminToken     string

	cancel     context.CancelFunc
	wg         sync.WaitGroup
	token      atomic.Int64 // the current term's token, 0 when not leading
	runnerDone atomic.Bool
	configSum  [32]byte // of the config last loaded or tried; guarded by reloadMu
	reloadMu   sync.Mutex
	closeOnce  sync.Once
}

// NewMain returns a Main with the defaults.
func NewMain(stdout, stderr io.Writer) *Main {
	host, _ := os.Hostname()
	return &Main{
		ConfigPath: "schedules.yaml", DataDir: "./beatd-data", EtcdClientPort: 2379, EtcdPeerPort: 2380,
		Broker: "redis://127.0.0.1:6379/0", ID: host, LeaseTTL: election.DefaultTTL, HTTPAddr: ":8080",
		LogFormat: "json", LogLevel: "info", Etcd: etcdFlags{Prefix: "/beatd/default/"},
		stdout: stdout, stderr: stderr,
	}
}

// ParseFlags reads flags, then BEATD_* environment variables for flags not
// given.
func (m *Main) ParseFlags(_ context.Context, args []string) error {
	fs := newFlagSet("run", m.stderr)
	fs.StringVar(&m.ConfigPath, "config", m.ConfigPath, "schedule file; reloaded on SIGHUP and on change")
	m.Etcd.register(fs)
	m.Cluster.register(fs)
	fs.StringVar(&m.DataDir, "data-dir", m.DataDir, "embedded etcd's data directory (without --etcd-endpoints)")
	fs.IntVar(&m.EtcdClientPort, "etcd-client-port", m.EtcdClientPort, "embedded etcd's client port on 127.0.0.1")
	fs.IntVar(&m.EtcdPeerPort, "etcd-peer-port", m.EtcdPeerPort, "embedded etcd's peer port on 127.0.0.1")
	fs.StringVar(&m.Broker, "broker", m.Broker, "Celery broker URL: redis://, rediss://, unix://, sentinel://")
	fs.StringVar(&m.BrokerMaster, "broker-master-name", "", "Redis Sentinel master name")
	fs.StringVar(&m.BrokerPassFile, "broker-password-file", "", "file holding the Redis password (else BEATD_BROKER_PASSWORD)")
	fs.StringVar(&m.KombuPrefix, "broker-key-prefix", "", "Kombu's global_keyprefix, if the workers use one")
	fs.StringVar(&m.RedisPrefix, "redis-prefix", "", "prefix of beatd's own Redis keys (default beatd:{<prefix>}:)")
	fs.DurationVar(&m.DedupTTL, "dedup-ttl", 0, "lifetime of a slot's dedup key (default max(7 days, the longest catchup_window))")
	fs.StringVar(&m.ID, "id", m.ID, "this replica's name (default: the hostname)")
	fs.DurationVar(&m.LeaseTTL, "lease-ttl", m.LeaseTTL, "etcd lease TTL: how long a dead leader holds on")
	fs.StringVar(&m.HTTPAddr, "http", m.HTTPAddr, "HTTP listen address for health, metrics, status and admin")
	fs.StringVar(&m.LogFormat, "log-format", m.LogFormat, "json or text")
	fs.StringVar(&m.LogLevel, "log-level", m.LogLevel, "debug, info, warn or error")
	fs.StringVar(&m.AdminTokenFile, "admin-token-file", "", "file holding the admin bearer token (else BEATD_ADMIN_TOKEN); without one the admin endpoints are disabled")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := m.checkClusterFlags(); err != nil {
		fmt.Fprintf(m.stderr, "beatd run: %v\n", err)
		return errors.New("usage")
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(m.stderr, "beatd run: unexpected argument %q\n", fs.Arg(0))
		return errors.New("usage")
	}
	if m.LogFormat != "json" && m.LogFormat != "text" {
		fmt.Fprintf(m.stderr, "beatd run: --log-format must be json or text\n")
		return errors.New("usage")
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
	prefix := m.Etcd.prefix()
	cluster := strings.Trim(prefix, "/")
	// The embedded etcd boots while the config is parsed: both take a
	// while with a large config, and there are cores for both.
	type started struct {
		srv *embedetcd.Server
		err error
	}
	var etcdc chan started
	if len(m.Etcd.endpoints()) == 0 {
		m.logEmbedded()
		if err := os.MkdirAll(m.DataDir, 0o700); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		etcdc = make(chan started, 1)
		go func() {
			srv, err := embedetcd.Start(m.embedConfig(ctx))
			etcdc <- started{srv, err}
		}()
	}
	cfg, err := loadConfig(m.ConfigPath)
	if etcdc != nil {
		s := <-etcdc
		if s.err != nil {
			return s.err
		}
		m.embedded = s.srv
		m.Etcd.Endpoints = strings.Join(s.srv.Endpoints, ",")
	}
	if err != nil {
		return err
	}
	m.configSum = fileSum(m.ConfigPath)
	if m.adminToken, err = secret(m.AdminTokenFile, "BEATD_ADMIN_TOKEN"); err != nil {
		return err
	}
	if m.etcd, err = m.Etcd.client(); err != nil {
		return err
	}
	m.store = store.New(m.etcd, prefix)

	brokerPass, err := secret(m.BrokerPassFile, "BEATD_BROKER_PASSWORD")
	if err != nil {
		return err
	}
	if m.rdb, err = publisher.NewClient(publisher.BrokerConfig{URL: m.Broker, MasterName: m.BrokerMaster, Password: brokerPass}); err != nil {
		return err
	}
	redisPrefix := m.RedisPrefix
	if redisPrefix == "" {
		redisPrefix = "beatd:{" + cluster + "}:"
	}
	dedup := m.DedupTTL
	if dedup <= 0 {
		dedup = publisher.DefaultDedupTTL
		for _, e := range cfg.Entries {
			dedup = max(dedup, e.CatchupWindow)
		}
	}
	pub := publisher.New(m.rdb, publisher.Options{Cluster: cluster, KeyPrefix: redisPrefix, DedupTTL: dedup})

	m.registry = prometheus.NewRegistry()
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.metrics = scheduler.NewMetrics(m.registry)
	host, _ := os.Hostname()
	m.sched, err = scheduler.New(scheduler.Config{Dispatcher: pub, Store: m.store, Logger: m.log, Metrics: m.metrics,
		Cluster: cluster, Origin: "beatd@" + host, KombuPrefix: m.KombuPrefix}, cfg)
	if err != nil {
		return err
	}
	m.elector, err = election.New(election.Config{Client: m.etcd, Prefix: prefix, ID: m.ID, TTL: m.LeaseTTL, Logger: m.log})
	if err != nil {
		return err
	}

	if m.httpLn, err = net.Listen("tcp", m.HTTPAddr); err != nil {
		return fmt.Errorf("http: %w", err)
	}
	m.httpSrv = &http.Server{Handler: api.Handler(api.Config{Backend: m, Gatherer: m.registry, AdminToken: m.adminToken, Logger: m.log}),
		ReadHeaderTimeout: 5 * time.Second}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	m.wg.Add(3)
	go func() {
		defer m.wg.Done()
		if err := m.httpSrv.Serve(m.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("http server", "err", err)
		}
	}()
	go func() {
		defer m.wg.Done()
		defer m.runnerDone.Store(true)
		m.lead(runCtx)
	}()
	go func() {
		defer m.wg.Done()
		m.watchConfig(runCtx)
	}()
	m.log.Info("beatd started", "config", m.ConfigPath, "entries", len(cfg.Entries), "broker", publisher.Redacted(m.Broker),
		"etcd", m.Etcd.Endpoints, "prefix", prefix, "http", m.httpLn.Addr().String(), "lease_ttl", m.LeaseTTL.String(), "version", versionString())
	return nil
}

// HTTPAddress is where the HTTP server listens (useful with --http :0).
func (m *Main) HTTPAddress() string { return m.httpLn.Addr().String() }

// lead campaigns, runs the scheduler for each term won, and campaigns
// again when a term ends, until ctx ends.
func (m *Main) lead(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		l, err := m.elector.Campaign(ctx)
		elected := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			m.metrics.EtcdErrors.Inc()
			m.log.Warn("campaign failed; retrying", "err", err, "backoff", backoff.String())
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		m.token.Store(l.Token)
		m.metrics.IsLeader.Set(1)
		m.metrics.FencingToken.Set(float64(l.Token))
		m.metrics.LeaderChanges.Inc()
		// The loop stops when the term ends or on shutdown; on shutdown it
		// first persists what it published, while still leader.
		schedCtx, cancel := context.WithCancel(l.Context())
		stop := context.AfterFunc(ctx, cancel)
		stopAvoid := m.avoidRaftLeader(schedCtx)
		err = m.sched.Run(schedCtx, scheduler.Term{Token: l.Token, Key: l.Key, Elected: elected})
		stopAvoid()
		stop()
		cancel()
		m.token.Store(0)
		m.metrics.IsLeader.Set(0)
		m.metrics.LeaderChanges.Inc()
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		rerr := l.Resign(rctx)
		rcancel()
		m.log.Info("term over", "token", l.Token, "reason", context.Cause(l.Context()), "loop", err, "resign", rerr)
	}
}

// Close stops the daemon gracefully: the loop finishes its publish in
// flight and persists it, the replica resigns so a standby leads at once,
// then everything shuts down.
func (m *Main) Close() error {
	var err error
	m.closeOnce.Do(func() {
		if m.cancel != nil {
			m.cancel()
		}
		if m.httpSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = m.httpSrv.Shutdown(ctx)
			cancel()
		}
		m.wg.Wait()
		if m.rdb != nil {
			_ = m.rdb.Close()
		}
		if m.etcd != nil {
			_ = m.etcd.Close()
		}
		if m.embedded != nil {
			m.embedded.Close()
		}
		if m.log != nil {
			m.log.Info("beatd stopped")
		}
	})
	return err
}

// Reload re-reads the config. A bad file keeps the running config.
func (m *Main) Reload() {
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	// Remember what was tried, good or bad, so the watcher reloads when the
	// file changes again (including back to the running version).
	m.configSum = fileSum(m.ConfigPath)
	cfg, err := loadConfig(m.ConfigPath)
	if err == nil {
		err = m.sched.Reload(cfg)
	}
	if err != nil {
		m.metrics.Reloads.WithLabelValues("error").Inc()
		m.metrics.ReloadOK.Set(0)
		m.log.Error("config reload failed; keeping the running config", "config", m.ConfigPath, "errors", strings.Split(err.Error(), "\n"))
		return
	}
	m.metrics.Reloads.WithLabelValues("ok").Inc()
	m.metrics.ReloadOK.Set(1)
	m.log.Info("config reloaded", "config", m.ConfigPath, "entries", len(cfg.Entries))
}

// loadConfig loads and validates the config.
func loadConfig(path string) (*schedule.Config, error) {
	return schedule.LoadFile(path)
}

// defaultGCPercent is beatd's GOGC unless the environment sets one. The
// hot path allocates little, so collecting at 50% growth costs little CPU
// and keeps the heap near its live size: with 100k entries, peak RSS 184
// MiB instead of 211 MiB at the default 100.
const defaultGCPercent = 50

func setGCPercent() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

func fileSum(path string) [32]byte {
	b, _ := os.ReadFile(path)
	return sha256.Sum256(b)
}

// watchConfig reloads when the config file changes. It watches the
// directory, so the symlink swap Kubernetes does for a ConfigMap counts.
func (m *Main) watchConfig(ctx context.Context) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		m.log.Warn("config watch unavailable; SIGHUP still reloads", "err", err)
		return
	}
	defer w.Close()
	abs, _ := filepath.Abs(m.ConfigPath)
	if err := w.Add(filepath.Dir(abs)); err != nil {
		m.log.Warn("config watch unavailable; SIGHUP still reloads", "err", err)
		return
	}
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			name := filepath.Base(ev.Name)
			if name == filepath.Base(abs) || strings.HasPrefix(name, "..") {
				debounce = time.After(200 * time.Millisecond)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			m.log.Warn("config watch", "err", err)
		case <-debounce:
			debounce = nil
			m.reloadMu.Lock()
			same := fileSum(m.ConfigPath) == m.configSum
			m.reloadMu.Unlock()
			if !same {
				m.Reload()
			}
		}
	}
}

// Alive implements api.Backend.
func (m *Main) Alive() error {
	if m.runnerDone.Load() {
		return errors.New("leadership loop stopped")
	}
	return nil
}

// Ready implements api.Backend: etcd and the broker answer, and the
// leader can publish.
func (m *Main) Ready(ctx context.Context) error {
	if _, err := m.etcd.Get(ctx, m.Etcd.prefix()+"leader/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		m.metrics.EtcdErrors.Inc()
		return fmt.Errorf("etcd unreachable: %w", err)
	}
	if err := m.rdb.Ping(ctx).Err(); err != nil {
		m.metrics.RedisErrors.Inc()
		return fmt.Errorf("broker unreachable: %w", err)
	}
	if m.token.Load() != 0 {
		if err := m.sched.PublishError(); err != nil {
			return fmt.Errorf("leader cannot publish: %w", err)
		}
	}
	return nil
}

// Status implements api.Backend, from etcd, so standbys serve it too.
func (m *Main) Status(ctx context.Context) (api.Status, error) {
	st, err := buildStatus(ctx, m.etcd, m.Etcd.prefix(), m.sched.Config(), time.Now())
	st.ID = m.ID
	st.Leader = st.LeaderID == m.ID && st.FencingToken != 0 && m.token.Load() == st.FencingToken
	return st, err
}

// Request implements api.Backend.
func (m *Main) Request(ctx context.Context, op, entry string) (string, error) {
	if m.sched.Config().Entry(entry) == nil {
		return "", api.ErrUnknownEntry
	}
	r, err := m.store.PutRequest(ctx, store.Op(op), entry, time.Now())
	return r.ID, err
}

// buildStatus reads leadership and entry state from etcd and merges it
// with a config (which may be nil: then only stored entries show).
func buildStatus(ctx context.Context, cli *clientv3.Client, prefix string, cfg *schedule.Config, now time.Time) (api.Status, error) {
	var out api.Status
	leader, err := election.Observe(ctx, cli, prefix)
	if err != nil && !errors.Is(err, election.ErrNoLeader) {
		return out, err
	}
	out.LeaderID, out.FencingToken = leader.ID, leader.Token
	states, err := store.New(cli, prefix).Load(ctx)
	if err != nil {
		return out, err
	}
	seen := map[string]bool{}
	add := func(name string, e *schedule.Entry) {
		es := api.EntryStatus{Name: name, RecentRuns: []store.Run{}}
		if e != nil {
			es.Task, es.Schedule, es.Enabled = e.Task, fmt.Sprint(e.Schedule), e.Enabled
		}
		st := states[name]
		if st != nil {
			es.Paused, es.TotalRunCount = st.Paused, st.TotalRunCount
			es.LastSlot, es.LastRunAt = timePtr(st.LastSlot), timePtr(st.LastRunAt)
			es.RecentRuns = append(es.RecentRuns, st.Recent...)
		}
		if e != nil && e.Enabled && !es.Paused {
			es.NextRunAt = timePtr(e.Schedule.Next(now))
		}
		out.Entries = append(out.Entries, es)
		seen[name] = true
	}
	if cfg != nil {
		for _, e := range cfg.Entries {
			add(e.Name, e)
		}
	}
	for name := range states {
		if !seen[name] {
			add(name, nil)
		}
	}
	return out, nil
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// secret reads a secret from a file, else from an environment variable.
// Secrets are never logged.
func secret(file, env string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read secret: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return os.Getenv(env), nil
}
