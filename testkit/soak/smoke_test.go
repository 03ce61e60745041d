package soak

import (
	"strings"
	"testing"
	"time"
)

// TestHarnessSmoke runs both harnesses briefly on small schedules, so CI
// notices when they stop working against the current binary. It judges the
// harness, not beatd: growth limits are off (a 12 s run says nothing about
// a plateau), and the figures only have to be there and make sense.
func TestHarnessSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts beatd, redis-server and celery beat")
	}
	ctx := signalContext(t)
	bin := beatdBinary(t, ctx)
	off := GrowthLimit{AbsMiBPerMin: 1e9}

	t.Run("soak", func(t *testing.T) {
		var log strings.Builder
		r, err := RunSoak(ctx, SoakConfig{Bin: bin, Entries: 50, Interval: time.Second, Duration: 12 * time.Second,
			Sample: 3 * time.Second, DBLimit: off, RSSLimit: off, BrokerLimit: off, KeysLimit: off, Log: &log})
		if err != nil {
			t.Fatalf("%v\n%s", err, log.String())
		}
		if len(r.Samples) < 4 || r.Fires < 50*6 || r.CPUPerFireUs <= 0 || r.BytesPerFire < 0 ||
			!strings.HasPrefix(r.BytesMethod, "delta of etcd_debugging_mvcc_total_put_size_in_bytes") || len(r.Growth) != 6 {
			t.Errorf("report: %d samples, %d fires, %.1f us CPU per fire, %.1f etcd B per fire (%s), %d growth fits\n%s",
				len(r.Samples), r.Fires, r.CPUPerFireUs, r.BytesPerFire, r.BytesMethod, len(r.Growth), log.String())
		}
		for _, s := range r.Samples[1:] {
			if !s.Etcd.OK || s.Etcd.DBSize <= 0 || s.RSS <= 0 || s.DataDir <= 0 || s.RedisUsed <= 0 || s.RedisKeys <= 0 || s.RedisKeys > 5*50+100 {
				t.Errorf("sample at t=%.0fs lacks etcd status, RSS, data dir or the broker's footprint: %+v", s.T, s)
			}
		}
		checkEnded(t, r.Pids)
	})

	t.Run("bench-celery", func(t *testing.T) {
		var log strings.Builder
		// Enough fires in 3 s for /proc's 10 ms CPU ticks to register.
		r, err := RunBench(ctx, BenchConfig{Bin: bin, Duration: 3 * time.Second, Warmup: time.Second, Interval: time.Second,
			CeleryEntries: 50, BeatdEntries: []int{500}, Log: &log})
		if err != nil {
			t.Fatalf("%v\n%s", err, log.String())
		}
		md := log.String()
		if len(r.Runs) != 2 || !strings.Contains(md, "| celery beat | 50 |") || !strings.Contains(md, "| beatd | 500 |") ||
			!strings.Contains(md, "celery beat CPU per fire / beatd CPU per fire at 500 entries") {
			t.Errorf("markdown:\n%s", md)
		}
		pids := map[string]int{"redis-server": r.RedisPid}
		for _, run := range r.Runs {
			if run.Delivered == 0 || run.FiresPS <= 0 || run.PeakRSSMiB <= 0 || run.Lag.Count == 0 {
				t.Errorf("%s: %+v", run.Scheduler, run)
			}
			pids[run.Scheduler] = run.Pid
		}
		checkEnded(t, pids)
	})
}

// checkEnded fails for any process of a finished run still alive.
func checkEnded(t *testing.T, pids map[string]int) {
	t.Helper()
	for name, pid := range pids {
		if pid == 0 {
			t.Errorf("no pid recorded for %s", name)
			continue
		}
		// Stop waits for each process, so it is gone (and reaped) by now.
		if alive(pid) {
			t.Errorf("%s (pid %d) still runs after the harness returned", name, pid)
		}
	}
}
