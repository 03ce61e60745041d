package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/prometheus/client_golang/prometheus"
)

// startSignal is a slog handler that passes on the "scheduling" record
// of a term: the term has started.
type startSignal struct {
	slog.Handler
	started chan slog.Record
}

func (h startSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h startSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "scheduling" {
		h.started <- r
	}
	return nil
}
func (h startSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h startSignal) WithGroup(string) slog.Handler      { return h }

// tenantYAML is n entries as a SaaS tenant table has them (as
// cmd/beatd's tenantFile): hourly-and-slower intervals, crontabs in six
// zones, one-offs.
func tenantYAML(n int) string {
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney", "America/Sao_Paulo"}
	var b strings.Builder
	b.WriteString("entries:\n")
	for i := range n {
		switch k := i % 10; {
		case k < 6:
			fmt.Fprintf(&b, "  tenant-%07d: {task: tasks.sync, every: %ds, start_at: '2026-01-01T%02d:%02d:%02dZ', args: [%d]}\n",
				i, []int{3600, 21600, 86400}[rng.IntN(3)], rng.IntN(24), rng.IntN(60), rng.IntN(60), i)
		case k < 9:
			fmt.Fprintf(&b, "  tenant-%07d: {task: tasks.report, crontab: {minute: '%d', hour: '*/%d'}, timezone: %s, kwargs: {tenant: %d}}\n",
				i, rng.IntN(60), []int{1, 2, 3, 4, 6, 12}[rng.IntN(6)], zones[rng.IntN(len(zones))], i)
		default:
			fmt.Fprintf(&b, "  tenant-%07d: {task: tasks.remind, at: '2027-%02d-%02dT%02d:00:00Z', args: [%d]}\n",
				i, 1+rng.IntN(12), 1+rng.IntN(28), rng.IntN(24), i)
		}
	}
	return b.String()
}

// BenchmarkTermStart is a shard's term start at 56,000 entries (900,000
// over 16 shards) whose states a last term stored: what a shard move's
// new leader pays after its election, the state read aside (the store is
// in memory here).
func BenchmarkTermStart(b *testing.B) {
	cfg := mustConfig(b, tenantYAML(56_000))
	st := newMemStore(7)
	term := func() slog.Record {
		h := startSignal{started: make(chan slog.Record, 1)}
		s, err := New(Config{Dispatcher: newFakeDispatcher(), Store: st, Metrics: NewMetrics(prometheus.NewRegistry()),
			Cluster: "beatd/bench", Origin: "beatd@bench", Logger: slog.New(h)}, cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx, Term{Fence: election.Fence{Token: 7}}) }()
		r := <-h.started
		time.Sleep(50 * time.Millisecond) // the baselines' write
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			b.Fatal(err)
		}
		return r
	}
	term() // the first term stores every entry's baseline
	b.ResetTimer()
	for b.Loop() {
		r := term()
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "start" || a.Key == "load_state" {
				if d, err := time.ParseDuration(a.Value.String()); err == nil {
					b.ReportMetric(float64(d.Milliseconds()), a.Key+"-ms")
				}
			}
			return true
		})
	}
}
