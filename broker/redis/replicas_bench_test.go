package redis

import (
	"context"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// BenchmarkPublishWait measures what --broker-min-replicas 1 costs: the
// time per batch (one pipelined round trip) without WAIT and with WAIT 1
// on a real replica on this machine.
func BenchmarkPublishWait(b *testing.B) {
	master := testutil.MustStartRedis(b)
	master.Stop()
	master.AOF = false // measure replication, not the disk
	master.Start()
	testutil.MustStartReplica(b, master.Addr())
	task := benchTask(b)
	for _, tc := range []struct {
		name string
		min  int
	}{{"wait=0/batch=64", 0}, {"wait=1/batch=64", 1}} {
		b.Run(tc.name, func(b *testing.B) {
			p := New(master.Client(), Options{Cluster: "beatd/bench", KeyPrefix: "beatd:{bench}:", MinReplicas: tc.min, MinReplicasTimeout: time.Second})
			ctx := context.Background()
			const batch = 64
			fires := make([]celery.Fire, batch)
			res := make([]broker.Result, batch)
			slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC).Add(time.Duration(tc.min) * 24 * time.Hour)
			b.ResetTimer()
			start := time.Now()
			for n := 0; n < b.N; n++ {
				for i := range fires {
					fires[i] = celery.Fire{Task: task, Slot: slot.Add(time.Duration(n*batch+i) * time.Millisecond)}
				}
				if err := p.Publish(ctx, 1, fires, res); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "fires/s")
		})
	}
}
