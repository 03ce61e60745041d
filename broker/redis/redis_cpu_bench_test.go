package redis

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

// redisCPU is redis-server's own CPU time so far (INFO cpu: user + sys,
// main thread and children alike).
func redisCPU(tb testing.TB, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// BenchmarkPublishRedisCPU is what the broker pays per fire: 20,000
// entries, every one due each round, published in the scheduler's
// batches of 512, and Redis's CPU per fire reported as redis-µs/fire.
// The queue is drained between rounds, as workers would, so its size
// stays flat.
func BenchmarkPublishRedisCPU(b *testing.B) {
	for _, aof := range []bool{false, true} {
		b.Run("aof="+strconv.FormatBool(aof), func(b *testing.B) { benchPublishRedisCPU(b, aof) })
	}
}

func benchPublishRedisCPU(b *testing.B, aof bool) {
	const entries, batch = 20000, 512
	rs := testutil.MustStartRedis(b)
	if !aof {
		rs.Stop()
		rs.AOF = false
		rs.Start()
	}
	cli := rs.Client()
	var yaml strings.Builder
	yaml.WriteString("entries:\n")
	for i := range entries {
		fmt.Fprintf(&yaml, "  e%d: {task: tasks.hello, every: 1s, kwargs: {n: %d}}\n", i, i)
	}
	cfg, err := config.Parse("bench.yaml", []byte(yaml.String()))
	if err != nil {
		b.Fatal(err)
	}
	tasks := make([]*celery.Task, entries)
	for i, e := range cfg.Entries {
		if tasks[i], err = celery.Compile(e.Spec(), "beatd/bench", "beatd@bench", ""); err != nil {
			b.Fatal(err)
		}
	}
	p := New(cli, Options{Cluster: "beatd/bench", KeyPrefix: "beatd:{bench}:", History: benchHistory})
	ctx := context.Background()
	if err := p.RaiseFence(ctx, 1); err != nil {
		b.Fatal(err)
	}
	fires := make([]celery.Fire, batch)
	res := make([]broker.Result, batch)
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	var spent time.Duration
	if benchBare {
		// The floor: the same messages, LPUSHed pipelined, no script.
		buf := make([]byte, 0, 1<<20)
		b.ResetTimer()
		for n := 0; n < b.N; n += batch {
			pipe := cli.Pipeline()
			for i := range min(batch, b.N-n) {
				f := celery.Fire{Task: tasks[(n+i)%entries], Slot: slot}
				buf = f.Task.AppendMessage(buf[:0], &f, 1, slot)
				pipe.LPush(ctx, "celery", string(buf))
			}
			c0 := redisCPU(b, cli)
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			spent += redisCPU(b, cli) - c0
			if n%entries == 0 {
				cli.Del(ctx, "celery")
			}
		}
		b.ReportMetric(float64(spent.Microseconds())/float64(b.N), "redis-µs/fire")
		return
	}
	b.ResetTimer()
	for n := 0; n < b.N; {
		round := slot.Add(time.Duration(n/entries) * time.Second)
		for lo := n % entries; lo < entries && n < b.N; lo += batch {
			k := min(batch, entries-lo, b.N-n)
			for i := range k {
				fires[i] = celery.Fire{Task: tasks[lo+i], Slot: round}
			}
			c0 := redisCPU(b, cli)
			if err := p.Publish(ctx, 1, fires[:k], res[:k]); err != nil {
				b.Fatal(err)
			}
			spent += redisCPU(b, cli) - c0
			n += k
		}
		b.StopTimer()
		if err := cli.Del(ctx, "celery").Err(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(spent.Microseconds())/float64(b.N), "redis-µs/fire")
	mem, _ := cli.Info(ctx, "memory").Result()
	for _, line := range strings.Split(mem, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			b.ReportMetric(f/float64(entries), "redis-B/entry")
		}
	}
	keys, _ := cli.DBSize(ctx).Result()
	b.ReportMetric(float64(keys)/float64(entries), "keys/entry")
}

var benchHistory = 0

// benchBare: BenchmarkPublishRedisCPU measures bare LPUSHes instead.
var benchBare = os.Getenv("BEATD_BENCH_BARE") != ""
