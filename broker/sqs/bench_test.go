package sqs

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
)

// procCPU is a process's user+system CPU time so far, from /proc.
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPublishEmulator is the whole SQS publish path against the
// emulator, in the daemon's batches of 256: the intent record in etcd,
// SendMessageBatch calls of ten (eight in flight), the done record. It
// reports fires/s and the CPU per fire of this process (beatd's side,
// with the embedded etcd in it) and of the emulator.
func BenchmarkPublishEmulator(b *testing.B) {
	e := sharedSQS(b)
	c := &cluster{cli: sharedEtcd(b), prefix: "/beatd-bench/" + uniq("b") + "/"}
	ctx := context.Background()
	resp, err := c.cli.Put(ctx, c.prefix+"leader/a", "a")
	if err != nil {
		b.Fatal(err)
	}
	token := resp.Header.Revision
	s, err := New(ctx, Options{URL: e.BrokerURL() + "&queue_name_prefix=" + uniq("bench") + "-", Etcd: c.cli, Prefix: c.prefix})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.RaiseFence(ctx, token); err != nil {
		b.Fatal(err)
	}
	// A typical entry: args, kwargs, a queue, an expiry.
	task := compile(b, "    {task: tasks.report, every: 1m, args: [42, nightly], kwargs: {region: eu, full: true}, options: {queue: reports.daily, expires: 300}}")
	const batch = 256
	fires := make([]celery.Fire, batch)
	res := make([]broker.Result, batch)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n := 0
	emuCPU0, selfCPU0 := procCPU(b, e.Proc().Pid()), selfCPU()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		for j := range fires {
			fires[j] = celery.Fire{Task: task, Slot: base.Add(time.Duration(n) * time.Second)}
			n++
		}
		if err := s.Publish(ctx, token, fires, res); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	fired := float64(b.N * batch)
	b.ReportMetric(fired/el.Seconds(), "fires/s")
	b.ReportMetric(float64((selfCPU()-selfCPU0).Microseconds())/fired, "beatd-cpu-µs/fire")
	b.ReportMetric(float64((procCPU(b, e.Proc().Pid())-emuCPU0).Microseconds())/fired, "emulator-cpu-µs/fire")
	b.ReportMetric(0, "ns/op")
}
