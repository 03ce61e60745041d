package redis

import (
	"context"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

func benchTask(b *testing.B) *celery.Task {
	cfg, err := config.Parse("bench.yaml", []byte("entries:\n  e: {task: tasks.hello, every: 1s, kwargs: {who: \"Zoë ☃\"}, options: {queue: reports, expires: 30, priority: 5}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	task, err := celery.Compile(cfg.Entries[0].Spec(), "beatd/bench", "beatd@bench", "")
	if err != nil {
		b.Fatal(err)
	}
	return task
}

func BenchmarkAppendMessage(b *testing.B) {
	task := benchTask(b)
	buf := make([]byte, 0, 4096)
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	now := slot.Add(3 * time.Millisecond)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := celery.Fire{Task: task, Slot: slot.Add(time.Duration(i) * time.Second)}
		buf = task.AppendMessage(buf[:0], &f, 42, now)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkPublish measures fenced, deduplicated fires per second into a
// real redis-server on this machine, pipelined in batches.
func BenchmarkPublish(b *testing.B) {
	for _, batch := range []int{1, 64, 512} {
		b.Run("batch="+itoa(batch), func(b *testing.B) {
			rs := testutil.MustStartRedis(b)
			rs.Stop()
			rs.AOF = false // measure the publisher, not the disk
			rs.Start()
			p := New(rs.Client(), Options{Cluster: "beatd/bench", KeyPrefix: "beatd:{bench}:"})
			task := benchTask(b)
			ctx := context.Background()
			fires := make([]celery.Fire, batch)
			res := make([]broker.Result, batch)
			slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for n := 0; n < b.N; n += batch {
				k := min(batch, b.N-n)
				for i := 0; i < k; i++ {
					fires[i] = celery.Fire{Task: task, Slot: slot.Add(time.Duration(n+i) * time.Millisecond)}
				}
				if err := p.Publish(ctx, 1, fires[:k], res[:k]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "fires/s")
		})
	}
}

func itoa(n int) string {
	s := ""
	for {
		s = string(rune('0'+n%10)) + s
		n /= 10
		if n == 0 {
			return s
		}
	}
}
