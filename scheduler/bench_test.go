package scheduler

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/prometheus/client_golang/prometheus"
)

// timedDispatcher wraps the real publisher and records, per fire, when its
// publish returned.
type timedDispatcher struct {
	*redisbroker.Publisher
	mu   sync.Mutex
	lags []time.Duration
	last map[int64]time.Duration // slot (unix ns) -> latest completion lag
	n    int
}

func (d *timedDispatcher) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	err := d.Publisher.Publish(ctx, token, fires, results)
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, f := range fires {
		if results[i] != broker.ResultOK {
			continue
		}
		d.n++
		lag := now.Sub(f.Slot)
		d.lags = append(d.lags, lag)
		k := f.Slot.UnixNano()
		d.last[k] = max(d.last[k], lag)
	}
	return err
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

type benchEnv struct {
	disp  *timedDispatcher
	store *store.Store
	token int64
	key   string
}

// newBenchEnv starts a real redis-server (no AOF: the disk is not what is
// measured) and an embedded etcd, and makes this process the leader.
func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	rs := testutil.MustStartRedis(b)
	rs.Stop()
	rs.AOF = false
	rs.Start()
	srv := testutil.MustStartEmbeddedEtcd(b)
	cli := testutil.NewEtcdClient(b, srv.Endpoints...)
	resp, err := cli.Put(context.Background(), "/beatd/bench/leader/x", "x")
	if err != nil {
		b.Fatal(err)
	}
	pub := redisbroker.New(rs.Client(), redisbroker.Options{Cluster: "beatd/bench", KeyPrefix: "beatd:{bench}:"})
	return &benchEnv{
		disp:  &timedDispatcher{Publisher: pub, last: map[int64]time.Duration{}},
		store: store.New(cli, "/beatd/bench/"),
		token: resp.Header.Revision, key: "/beatd/bench/leader/x",
	}
}

func (env *benchEnv) run(b *testing.B, yaml string, d time.Duration) {
	b.Helper()
	env.runBatch(b, yaml, d, 0)
}

// runBatch is run with Config.BatchSize batch (0: the default).
func (env *benchEnv) runBatch(b *testing.B, yaml string, d time.Duration, batch int) {
	b.Helper()
	s, err := New(Config{Dispatcher: env.disp, Store: env.store, Metrics: NewMetrics(prometheus.NewRegistry()),
		Cluster: "beatd/bench", Origin: "beatd@bench", BatchSize: batch}, mustConfig(b, yaml))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := s.Run(ctx, Term{Fence: election.Fence{Token: env.token, Key: env.key}}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBurst has 1,000 or 20,000 entries due at the same instant
// every second, for b.N seconds, and reports how long each burst took to
// be fully published (p50, p90, max; the first, which pays for the
// start, left out) and the per-fire lag p99, at the default batch size and
// at the previous one (512), which took ~20% longer at 20,000.
func BenchmarkBurst(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		for _, batch := range []int{0, 512} {
			name := fmt.Sprintf("%d/batch=default", n)
			if batch > 0 {
				name = fmt.Sprintf("%d/batch=%d", n, batch)
			}
			b.Run(name, func(b *testing.B) {
				env := newBenchEnv(b)
				var sb strings.Builder
				sb.WriteString("entries:\n")
				for i := 0; i < n; i++ {
					fmt.Fprintf(&sb, "  e%05d: {task: tasks.add, every: 1s, args: [%d, 1], relative: true}\n", i, i)
				}
				seconds := max(b.N, 5)
				b.ResetTimer()
				env.runBatch(b, sb.String(), time.Duration(seconds)*time.Second+500*time.Millisecond, batch)
				b.StopTimer()
				slots := slices.Sorted(maps.Keys(env.disp.last))
				if len(slots) < 2 {
					b.Fatalf("%d bursts published", len(slots))
				}
				var bursts []time.Duration
				for _, k := range slots[1:] {
					bursts = append(bursts, env.disp.last[k])
				}
				b.ReportMetric(float64(len(bursts)), "bursts")
				b.ReportMetric(float64(percentile(bursts, 0.5).Microseconds())/1000, "burst-p50-ms")
				b.ReportMetric(float64(percentile(bursts, 0.9).Microseconds())/1000, "burst-p90-ms")
				b.ReportMetric(float64(percentile(bursts, 1).Microseconds())/1000, "burst-max-ms")
				b.ReportMetric(float64(percentile(env.disp.lags, 0.99).Microseconds())/1000, "fire-lag-p99-ms")
			})
		}
	}
}

// BenchmarkLagSteady: 200 entries at staggered 100ms intervals, reporting
// the dispatch lag (publish time minus slot) percentiles.
func BenchmarkLagSteady(b *testing.B) {
	env := newBenchEnv(b)
	var sb strings.Builder
	sb.WriteString("entries:\n")
	for i := 0; i < 200; i++ {
		fmt.Fprintf(&sb, "  e%03d: {task: tasks.add, every: 100ms, start_at: 2026-01-01T00:00:00.%03dZ}\n", i, (i*7)%100)
	}
	seconds := max(b.N, 5)
	b.ResetTimer()
	env.run(b, sb.String(), time.Duration(seconds)*time.Second)
	b.StopTimer()
	b.ReportMetric(float64(env.disp.n), "fires")
	b.ReportMetric(float64(percentile(env.disp.lags, 0.5).Microseconds())/1000, "lag-p50-ms")
	b.ReportMetric(float64(percentile(env.disp.lags, 0.99).Microseconds())/1000, "lag-p99-ms")
	b.ReportMetric(float64(percentile(env.disp.lags, 1).Microseconds())/1000, "lag-max-ms")
}

// BenchmarkThroughput measures the sustained rate of fenced fires through
// the whole loop (heap, pipelined publish, batched guarded etcd writes):
// 1,000 entries each with 100 missed slots under catchup: all, drained as
// fast as the loop can.
func BenchmarkThroughput(b *testing.B) {
	env := newBenchEnv(b)
	const entries, backlog = 1000, 100
	last := time.Now().Add(-backlog * time.Second).Truncate(time.Second)
	states := store.NewTable()
	var sb strings.Builder
	sb.WriteString("entries:\n")
	for i := 0; i < entries; i++ {
		name := fmt.Sprintf("e%04d", i)
		fmt.Fprintf(&sb, "  %s: {task: tasks.add, every: 1s, args: [%d, 1], catchup: all, max_catchup: %d, relative: true}\n", name, i, backlog+10)
		states.Set(store.EntryState{Name: name, LastSlot: last})
	}
	if err := env.store.Save(context.Background(), election.Fence{Key: env.key, Token: env.token}, states, nil); err != nil {
		b.Fatal(err)
	}
	want := entries * backlog
	s, err := New(Config{Dispatcher: env.disp, Store: env.store, Metrics: NewMetrics(prometheus.NewRegistry()),
		Cluster: "beatd/bench", Origin: "beatd@bench"}, mustConfig(b, sb.String()))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- s.Run(ctx, Term{Fence: election.Fence{Token: env.token, Key: env.key}}) }()
	testutil.Eventually(b, 10*time.Minute, "every fire published", func() bool {
		env.disp.mu.Lock()
		defer env.disp.mu.Unlock()
		return env.disp.n >= want
	})
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(want)/elapsed.Seconds(), "fires/s")
}
