package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/version"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/catalog"
	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/leader"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// opsState is what the daemon keeps for operators: the config to publish
// to the catalog and its dependency health.
type opsState struct {
	candidate []byte // the file loadConfig parsed last; guarded by Main.reloadMu
	running   atomic.Pointer[loadedConfig]
	kick      chan struct{} // a new config to publish to the catalog
	wg        sync.WaitGroup

	dependencyUp *prometheus.GaugeVec
}

// loadedConfig is the running config's file and size. The file is kept
// only until it is first compressed for the catalog.
type loadedConfig struct {
	data    []byte
	entries int
	once    sync.Once
	payload catalog.Payload
}

func (lc *loadedConfig) prepared() catalog.Payload {
	lc.once.Do(func() {
		lc.payload = catalog.Prepare(lc.data)
		lc.data = nil
	})
	return lc.payload
}

// loadConfig reads and validates the config, keeping the bytes so that,
// once the scheduler accepts the config, the leader can publish them. Its
// error is a *config.CheckError.
func (m *Main) loadConfig() (*config.Config, error) {
	data, err := os.ReadFile(m.ConfigPath)
	if err != nil {
		return nil, &config.CheckError{Err: fmt.Errorf("schedule: read config: %w", err)}
	}
	cfg, err := config.Check(m.ConfigPath, data, m.configOptions())
	if err != nil {
		return nil, err
	}
	m.ops.candidate = data
	return cfg, nil
}

// configOptions are the validation settings of the command line, for the
// file and, through its Config, every runtime entry.
func (m *Main) configOptions() config.Options {
	return config.Options{MinInterval: m.MinInterval}
}

// configAccepted records that the file last loaded, of entries entries,
// now runs: the leader publishes it to the catalog once. A sharded
// replica keeps its bytes for its shards' terms (Main.fileData).
func (m *Main) configAccepted(entries int) {
	m.ops.running.Store(&loadedConfig{data: m.ops.candidate, entries: entries})
	if m.Shards > 1 {
		m.fileData = m.ops.candidate
	}
	m.ops.candidate = nil
	if entries == 0 {
		m.log.Warn("the config has no entries: nothing will be published", "config", m.ConfigPath)
	}
	select {
	case m.ops.kick <- struct{}{}:
	default:
	}
}

// startOps starts the operator goroutines; they stop when ctx ends and
// Close waits for them.
func (m *Main) startOps(ctx context.Context) {
	m.ops.dependencyUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "beatd_dependency_up",
		Help: "1 if the dependency answered this replica's last probe (every 5s), else 0."}, []string{"dependency"})
	m.registry.MustRegister(m.ops.dependencyUp, buildInfo())
	m.ops.wg.Add(1)
	go func() {
		defer m.ops.wg.Done()
		m.monitor(ctx)
	}()
}

// buildInfo is beatd_build_info: constant 1, labelled with the version.
func buildInfo() prometheus.Collector {
	revision := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_build_info", Help: "Always 1; the labels say which beatd runs.",
		ConstLabels: prometheus.Labels{"version": version.String(), "revision": revision, "goversion": runtime.Version()}})
	g.Set(1)
	return g
}

// probeEvery is how often the monitor probes etcd and the broker, and
// reminder how often it repeats a warning while one stays down.
const (
	probeEvery = 5 * time.Second
	reminder   = 30 * time.Second
)

// monitor probes etcd and the broker and logs while either is down: at
// once, then every reminder, then once when it is back. A degraded
// replica is never silent.
func (m *Main) monitor(ctx context.Context) {
	type dep struct {
		downLog
		probe func(context.Context) error
	}
	deps := []*dep{
		{downLog: downLog{name: "etcd", where: m.Etcd.Endpoints}, probe: func(ctx context.Context) error {
			_, err := m.etcd.Get(ctx, keys.Leaders(m.Etcd.KeyPrefix()), clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err
		}},
		{downLog: downLog{name: "broker", where: broker.Redacted(m.Broker)}, probe: m.brokerCheck},
	}
	t := m.clock.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		for _, d := range deps {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := d.probe(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			now := m.clock.Now()
			if err != nil {
				m.ops.dependencyUp.WithLabelValues(d.name).Set(0)
				d.down(m.log, now, err, "leader", m.leader.Token() != 0)
				continue
			}
			m.ops.dependencyUp.WithLabelValues(d.name).Set(1)
			d.up(m.log, now)
		}
		t.Reset(probeEvery)
	}
}

// downLog is the one owner of a dependency's "NAME unreachable" ERROR
// lines, at start-up (waitEtcd) and while running (monitor): at once,
// then every reminder while it stays down, then one INFO when it is back.
type downLog struct {
	name, where        string
	downSince, lastLog time.Time
}

// down notes a failed probe at now, logging if it is time to.
func (d *downLog) down(log *slog.Logger, now time.Time, err error, attrs ...any) {
	if d.downSince.IsZero() {
		d.downSince = now
	}
	if !d.lastLog.IsZero() && now.Sub(d.lastLog) < reminder {
		return
	}
	d.lastLog = now
	log.Error(d.name+" unreachable", append([]any{"at", d.where, "err", err,
		"down_for", now.Sub(d.downSince).Round(time.Second).String()}, attrs...)...)
}

// up notes a probe that passed at now.
func (d *downLog) up(log *slog.Logger, now time.Time) {
	if !d.downSince.IsZero() {
		log.Info(d.name+" reachable again", "at", d.where, "was_down_for", now.Sub(d.downSince).Round(time.Second).String())
	}
	d.downSince, d.lastLog = time.Time{}, time.Time{}
}

// publishCatalog publishes the running config to etcd for term l: once
// at the start of the term and once per reload, retrying failures. The
// returned func stops it and waits.
func (m *Main) publishCatalog(l leader.Term) (stop func()) {
	ctx, cancel := context.WithCancel(l.Lease)
	done := make(chan struct{})
	select { // a reload before this term is published below anyway
	case <-m.ops.kick:
	default:
	}
	go func() {
		defer close(done)
		pending, b := true, retry.Backoff(time.Second, time.Minute)
		var t clockwork.Timer
		for {
			var again <-chan time.Time
			if pending {
				err := m.publishCatalogOnce(ctx, l)
				switch {
				case err == nil:
					pending = false
					b.Reset()
				case errors.Is(err, catalog.ErrNotLeader) || ctx.Err() != nil:
					return
				default:
					wait := b.NextBackOff()
					m.log.Warn("publishing the config to etcd failed; retrying", "err", err, "backoff", wait.String())
					t = m.clock.NewTimer(wait)
					again = t.Chan()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-m.ops.kick:
				pending = true
			case <-again:
			}
			if t != nil {
				t.Stop()
				t = nil
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (m *Main) publishCatalogOnce(ctx context.Context, l leader.Term) error {
	lc := m.ops.running.Load()
	if lc == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h := catalog.Header{File: m.ConfigPath, Entries: lc.entries, LeaderID: m.ID, Token: l.Token,
		PublishedAt: m.clock.Now().UTC(), StatusURL: m.statusURL(), RequireNotes: m.RequireNotes, MinInterval: m.MinInterval}
	if err := catalog.Publish(ctx, m.etcd, m.Etcd.KeyPrefix(), l.Fence, h, lc.prepared()); err != nil {
		return err
	}
	m.log.Debug("config published to etcd", "entries", lc.entries, "token", l.Token)
	return nil
}

// statusURL is where other hosts reach this replica's GET /status.
func (m *Main) statusURL() string { return m.advertisedURL() + "/status" }
