package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBrokerWatchdogConfirmsBeforeHandover: a leader whose path has failed
// for --broker-failover-after, with a standby registered as reaching the
// broker, pings once more before it resigns. When an outage every
// replica saw ends just then, the standby's "ok" is news of the end, not of
// a cut path, and the ping that passes keeps the leader; a ping that fails
// hands over.
func TestBrokerWatchdogConfirmsBeforeHandover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })

	for _, tc := range []struct {
		name     string
		ping     error // the confirming ping's result
		handover bool
	}{
		{"the broker answers again", nil, false},
		{"the path is still cut", errors.New("i/o timeout"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
			var logs testutil.SyncBuffer
			m := &Main{Options: Options{ID: "r0", BrokerFailoverAfter: 3 * time.Second},
				clock: clock, etcd: cli, log: slog.New(slog.NewTextHandler(&logs, nil)), sched: &scheduler.Scheduler{}}
			m.Etcd.Prefix = "/" + strings.ReplaceAll(t.Name(), " ", "_") + "/"
			m.brokerHA.handovers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "h"}, []string{"reason"})
			m.brokerHA.err, m.brokerHA.probed = errors.New("i/o timeout"), true
			m.brokerHA.downSince = clock.Now().Add(-4 * time.Second)
			standby, _ := json.Marshal(election.Replica{ID: "r1", Broker: "ok", Health: "ok", Updated: clock.Now()})
			if _, err := cli.Put(context.Background(), keys.Replicas(m.Etcd.KeyPrefix())+"r1", string(standby)); err != nil {
				t.Fatal(err)
			}
			var pings, resigns atomic.Int32
			m.brokerPing = func(ctx context.Context) error {
				pings.Add(1)
				if _, ok := ctx.Deadline(); !ok {
					t.Error("the confirming ping has no deadline")
				}
				return tc.ping
			}
			ended := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				m.brokerWatchdog(ctx, func(context.Context) error { resigns.Add(1); return nil }, func(err error) { ended <- err })
			}()
			t.Cleanup(func() { cancel(); <-done })

			// The watchdog's ticker exists; each tick then finds the standby
			// and the failure old enough.
			if err := clock.BlockUntilContext(ctx, 1); err != nil {
				t.Fatal(err)
			}
			ticks := int32(3)
			if tc.handover {
				ticks = 1 // the first tick ends the watchdog
			}
			for tick := int32(1); tick <= ticks; tick++ {
				clock.Advance(brokerProbeEvery)
				testutil.EventuallyEvery(t, 10*time.Second, 5*time.Millisecond, "the watchdog's confirming ping", func() bool {
					return pings.Load() >= tick
				})
			}
			if tc.handover {
				select {
				case err := <-ended:
					if !errors.Is(err, errBrokerHandover) {
						t.Fatalf("term ended with %v, want errBrokerHandover", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("no handover although the confirming ping failed")
				}
				if resigns.Load() != 1 || pings.Load() != 1 {
					t.Fatalf("resigns %d, pings %d; want 1 and 1", resigns.Load(), pings.Load())
				}
				return
			}
			select {
			case err := <-ended:
				t.Fatalf("handed over (%v) although the broker answered the confirming ping", err)
			default:
			}
			if resigns.Load() != 0 || pings.Load() != 3 {
				t.Fatalf("resigns %d, pings %d; want 0 and a ping at each of 3 ticks", resigns.Load(), pings.Load())
			}
			if n := strings.Count(logs.String(), "not handing over"); n != 1 {
				t.Errorf("%d lines of the spared handover over 3 ticks, want 1:\n%s", n, logs.String())
			}
		})
	}
}
