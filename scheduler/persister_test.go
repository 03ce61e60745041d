package scheduler

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/store"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// saveRecorder is a StateStore that records when each Save came, on the
// fake clock, and passes it on a channel.
type saveRecorder struct {
	clock clockwork.Clock
	saved chan time.Time
	mu    sync.Mutex
}

func (r *saveRecorder) Load(context.Context) (*store.Table, error) { return store.NewTable(), nil }
func (r *saveRecorder) Save(_ context.Context, _ election.Fence, t *store.Table, _ []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	t.MarkClean()
	r.saved <- r.clock.Now()
	return nil
}
func (r *saveRecorder) PendingRequests(context.Context) ([]store.Request, int64, error) {
	return nil, 0, nil
}
func (r *saveRecorder) WatchRequests(context.Context, int64) <-chan struct{} { return nil }

// TestPersisterWaitsOutABurst: a periodic write that comes due while the
// loop publishes waits until the loop is done, or burstDefer at most; one
// that comes due while the loop is idle, or a flush, goes at once.
func TestPersisterWaitsOutABurst(t *testing.T) {
	t.Parallel()
	const (
		interval = time.Second
		quiet    = 100 * time.Millisecond // a fifth of burstDefer: no write in it
	)
	for _, tc := range []struct {
		name string
		// busy: the loop is publishing as the tick comes; ends: it
		// stops after quiet; flush: a flush is asked for after quiet.
		busy, ends, flush bool
	}{
		{name: "idle"},
		{name: "burst ends", busy: true, ends: true},
		{name: "burst outlasts the deferral", busy: true},
		{name: "flush during a burst", busy: true, flush: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := clockwork.NewFakeClock()
			rec := &saveRecorder{clock: clock, saved: make(chan time.Time, 4)}
			p := newPersister(rec, election.Fence{}, store.NewTable(), Config{Clock: clock, StateInterval: interval,
				Metrics: NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); p.run(ctx) }()
			defer func() { cancel(); <-done }()

			p.save(store.EntryState{Name: "e", LastSlot: clock.Now()})
			if tc.busy {
				p.publishing()
			}
			bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
			defer bcancel()
			if err := clock.BlockUntilContext(bctx, 1); err != nil { // run's tick
				t.Fatal(err)
			}
			ticked := time.Now()
			clock.Advance(interval)
			written := func(within time.Duration) bool {
				select {
				case <-rec.saved:
					return true
				case <-time.After(within):
					return false
				}
			}
			if !tc.busy {
				if !written(10 * time.Second) {
					t.Fatal("an idle loop's state was not written")
				}
				return
			}
			if written(quiet) {
				t.Fatal("written during the burst")
			}
			switch {
			case tc.ends:
				p.published()
			case tc.flush:
				if err := p.flush(bctx, false); err != nil {
					t.Fatal(err)
				}
			}
			if !written(10 * time.Second) {
				t.Fatal("never written")
			}
			waited := time.Since(ticked)
			if short := tc.ends || tc.flush; short && waited >= burstDefer || !short && waited < burstDefer {
				t.Fatalf("written %s after the tick (burstDefer %s)", waited, burstDefer)
			}
		})
	}
}
