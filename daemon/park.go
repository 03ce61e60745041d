package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/status"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A parked replica (--park) is an embedded etcd member and nothing else:
// it keeps etcd's quorum while the cluster's schedule is stopped, which
// an offline resize needs (docs/shards.md, "Resize on the embedded
// topology"). Stopping the replicas of the embedded topology stops etcd,
// so `beatd shards resize` had no etcd to run against; restarting each
// replica parked stops its scheduling and keeps its member.
//
// Parking is a separate start path, not a mode of the running daemon, so
// that nothing of the schedule can run by mistake: no config is loaded, no
// broker is dialled, no election is joined, no registration is written,
// no control request is taken, and the shard count is neither checked nor
// recorded (a parked replica must restart while a resize runs: a member
// that cannot rejoin would cost the resize its quorum). `beatd shards
// resize` counts registrations and election candidates to know the
// cluster is stopped, and a parked replica has neither.

// ErrParked answers every control request to a parked replica.
var ErrParked = errors.New("parked: this replica runs its etcd member only (--park); it takes no control requests; restart it without --park to run the schedule")

// parkedWhy is Parked.Why in /status.
const parkedWhy = "started with --park: an etcd member only, for an offline resize; it does not register, campaign, publish or take control requests"

// checkParkFlags refuses --park where it has no member to keep.
func (m *Main) checkParkFlags() error {
	if m.Park && len(m.Etcd.EndpointURLs()) > 0 {
		return errors.New("--park keeps this replica's embedded etcd member running while the cluster is stopped for a resize; " +
			"with --etcd-endpoints it has no member to keep: stop the replica instead (docs/shards.md)")
	}
	return nil
}

// runParked starts a parked replica: its embedded etcd member, and HTTP
// answering the probes, /metrics and a read-only /status. Everything else
// is refused with ErrParked.
func (m *Main) runParked(ctx context.Context, prefix string) error {
	if err := m.connectEtcd(ctx); err != nil {
		return err
	}
	m.registry = prometheus.NewRegistry()
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	parked := prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_parked",
		Help: "1 while this replica is parked (--park): it runs its embedded etcd member only, and leads nothing."})
	parked.Set(1)
	m.registry.MustRegister(parked)
	var err error
	if m.tokens, err = auth.New(auth.Options{File: m.TokensFile, Admin: m.adminToken, Logger: m.log, Now: m.clock.Now}); err != nil {
		return err
	}
	b := &parkedBackend{id: m.ID, cli: m.etcd, prefix: prefix, since: m.started}
	cfg := api.Config{Backend: b, Gatherer: m.registry, Tokens: m.tokens, Logger: m.log, Now: m.clock.Now}
	full := api.Handler(cfg)
	mux := http.NewServeMux()
	for _, route := range []string{"GET /healthz", "GET /readyz", "GET /metrics", "GET /status"} {
		mux.Handle(route, full)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": ErrParked.Error()})
	})
	m.setHandler(mux)
	if m.metricsSrv != nil {
		m.setMetricsHandler(api.ProbeHandler(cfg))
	}
	close(m.apiUp)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel, m.runCtx = cancel, runCtx
	m.watchUnauthenticated(runCtx)
	count, resize := "unknown", ""
	sctx, cancelShow := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShow()
	if info, err := b.show(sctx); err == nil {
		count, resize = strconv.Itoa(info.ShardCount), info.Resize
	}
	m.log.Info("beatd parked: running the embedded etcd member only; not registering, campaigning or publishing (restart without --park to run the schedule)",
		"etcd", m.Etcd.Endpoints, "prefix", prefix, "http", m.httpLn.Addr().String(), "shard_count", count, "resize", resize)
	return nil
}

// parkedBackend is a parked replica's api.Backend.
type parkedBackend struct {
	id     string
	cli    *clientv3.Client
	prefix string
	since  time.Time
}

// Alive: the process answers; its member's health is Ready's.
func (b *parkedBackend) Alive() error { return nil }

// Ready is whether etcd answers a linearizable read through this
// replica's member: the quorum the parked members are there to keep.
func (b *parkedBackend) Ready(ctx context.Context) error {
	if _, err := b.cli.Get(ctx, keys.ShardCount(b.prefix), clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("parked: etcd does not answer: %w", err)
	}
	return nil
}

// Status is the replica's parked state and the cluster's count and
// resize, with no entries (a parked replica holds none).
func (b *parkedBackend) Status(ctx context.Context, _ api.StatusQuery) (api.Status, error) {
	p, err := b.show(ctx)
	if err != nil {
		return api.Status{}, err
	}
	return api.Status{ID: b.id, Entries: []api.EntryStatus{}, Parked: &p}, nil
}

// Request refuses: a parked replica takes no control writes.
func (b *parkedBackend) Request(context.Context, api.Action) (string, error) { return "", ErrParked }

func (b *parkedBackend) show(ctx context.Context) (status.Parked, error) {
	info, err := reshard.Show(ctx, b.cli, b.prefix)
	if err != nil {
		return status.Parked{}, err
	}
	p := status.Parked{Since: b.since, Why: parkedWhy, ShardCount: info.Count}
	if r := info.Resizing; r != nil {
		p.Resize = r.String()
	}
	return p, nil
}
