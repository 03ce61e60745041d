package scheduler

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/testkit/tenants"
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

// BenchmarkTermStart is a shard's term start at 56,000 entries (900,000
// over 16 shards) whose states a last term stored: what a shard move's
// new leader pays after its election, the state read aside (the store is
// in memory here).
func BenchmarkTermStart(b *testing.B) {
	var yaml strings.Builder
	if err := tenants.Write(&yaml, 56_000); err != nil {
		b.Fatal(err)
	}
	cfg := mustConfig(b, yaml.String())
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
