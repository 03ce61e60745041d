package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/soak"
	"github.com/beatd/beatd/testkit/tenants"
	"github.com/beatd/beatd/testkit/testutil"
)

var (
	benchScale  = flag.Bool("bench-scale", false, "run the scale benchmark (make bench-scale)")
	scaleSizes  = flag.String("scale-sizes", "10000,100000,300000,1000000", "bench-scale: the numbers of entries measured")
	scaleSteady = flag.Duration("scale-steady", 60*time.Second, "bench-scale: how long the steady state is measured at each size")
	scaleHeap   = flag.String("scale-heap", "", "bench-scale: a directory for heap profiles of the leader before the kill and the new leader after it")
)

// tenantFile writes n runtime entries as SaaS tenants have them
// (tenants.Write) to path.
func tenantFile(t *testing.T, path string, n int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tenants.Write(f, n); err != nil {
		t.Fatal(err)
	}
}

// scalePoint is one size's figures.
type scalePoint struct {
	Entries        int
	ApplySeconds   float64
	ApplyPerSecond float64
	// The first leader, loaded through the API, then a standby that takes
	// over after a kill -9: from the kill to its election, from its
	// election to scheduling, and to its first fire.
	ElectedAfter, StartSeconds, FirstFireAfter float64
	// StandbyBoot is from a standby's start to its /healthz (its sources
	// read), beside the running leader.
	StandbyBoot                            float64
	StandbyPeakRSS, LeaderRSS              int64
	FiresPerSecond                         float64
	LagP99                                 string
	EtcdDBBytes, BrokerBytes, MetricsBytes int64
	EtcdRSS                                int64
	StatusBytes, ListPageBytes             int64
	// PutToFire is from a PUT of one new entry (every second) to its
	// first message; Console the overview page's time and size.
	PutToFire, ConsoleSeconds   float64
	ConsoleBytes                int64
	Duplicates, Missed, Audited int
	// SteadyCPU is the cores the leader, the standby and etcd used over
	// the steady state: what shares the machine with the leader's loop.
	SteadyCPU [3]float64
}

// TestBenchScale measures beatd at each of -scale-sizes runtime entries
// on the etcd binary and a Redis: the bulk load, the steady state, and a
// kill -9 failover to a standby, audited slot by slot across it.
func TestBenchScale(t *testing.T) {
	if !*benchScale {
		t.Skip("the scale benchmark is opt-in: make bench-scale (or go test ./cmd/beatd -run TestBenchScale -args -bench-scale)")
	}
	var points []scalePoint
	for _, s := range strings.Split(*scaleSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			t.Fatal(err)
		}
		t.Run(s, func(t *testing.T) { points = append(points, benchScaleAt(t, n)) })
	}
	t.Logf("| entries | apply entries/s | standby boot | failover: elected / start / first fire (s) | standby peak RSS | leader RSS | fires/s | lag p99 | etcd DB | etcd RSS | broker | /metrics | /status | list page | PUT → first fire | console overview | audit |")
	t.Logf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, p := range points {
		t.Logf("| %d | %.0f (%.1f s) | %.1f s | %.1f / %.1f / %.1f | %s | %s | %.0f | ≤ %s | %s | %s | %s | %s | %s | %s | %.2f s | %.2f s, %s | %d slots, %d duplicate, %d missed |",
			p.Entries, p.ApplyPerSecond, p.ApplySeconds, p.StandbyBoot, p.ElectedAfter, p.StartSeconds, p.FirstFireAfter,
			mib(p.StandbyPeakRSS), mib(p.LeaderRSS), p.FiresPerSecond, p.LagP99, mib(p.EtcdDBBytes), mib(p.EtcdRSS),
			mib(p.BrokerBytes), kib(p.MetricsBytes), kib(p.StatusBytes), kib(p.ListPageBytes), p.PutToFire, p.ConsoleSeconds, kib(p.ConsoleBytes), p.Audited, p.Duplicates, p.Missed)
	}
	for _, p := range points {
		t.Logf("%d entries: %.0f bytes of standby peak RSS and %.2f µs of start per entry; steady CPU (cores): leader %.2f, standby %.2f, etcd %.2f", p.Entries,
			float64(p.StandbyPeakRSS)/float64(p.Entries), p.StartSeconds*1e6/float64(p.Entries), p.SteadyCPU[0], p.SteadyCPU[1], p.SteadyCPU[2])
	}
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
func kib(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }

// startBenchEtcd starts the etcd binary as the benches run it: a quota
// past any size they reach, and history compacted after a minute; args
// are added to its flags.
func startBenchEtcd(t *testing.T, dir string, args ...string) *harness.EtcdCluster {
	etcd, err := harness.StartEtcdCluster(dir, 1, nil, append([]string{"--quota-backend-bytes", strconv.Itoa(8 << 30),
		"--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1m"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Stop)
	return etcd
}

// benchCluster is a cluster at prefix on the etcd binary (etcdArgs added
// to its flags) and a Redis, with no replica yet.
func benchCluster(t *testing.T, dir, prefix string, etcdArgs ...string) (*cluster, *harness.EtcdCluster) {
	etcd := startBenchEtcd(t, dir, etcdArgs...)
	c := &cluster{t: t, etcd: []string{etcd.Members[0].ClientURL()}, redis: testutil.MustStartRedis(t), dir: dir, prefix: prefix}
	c.rdb = c.redis.Client()
	c.observer = testutil.NewEtcdClient(t, c.etcd...)
	return c, etcd
}

func benchScaleAt(t *testing.T, n int) scalePoint {
	p := scalePoint{Entries: n}
	dir := t.TempDir()
	c, etcd := benchCluster(t, dir, "/beatd/scale/")
	c.config = filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(c.config, []byte("entries:\n  seed: {task: tasks.add, every: 1h}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--lease-ttl", "5s", "--log-fires", "0"}
	lead := c.startReplica("r0", flags...)
	lead.waitHealthy()
	c.leader("", 30*time.Second)

	file := filepath.Join(dir, "tenants.yaml")
	tenantFile(t, file, n)
	start := time.Now()
	profiled := cpuProfileLater(t, lead, n, "leader-apply", time.Duration(n)*60*time.Microsecond) // ~40% into a bulk load
	code, out, errs := c.apiCLI(lead, "admin", "entries", "apply", "-f", file)
	// Timed before the profile is waited for: a load shorter than the
	// profile's delay and 20 s would otherwise take that long.
	p.ApplySeconds = time.Since(start).Seconds()
	<-profiled
	if code != 0 || !strings.Contains(out, fmt.Sprintf("applied %d/%d entries", n, n)) {
		t.Fatalf("apply: exit %d\n%s\n%s", code, lastLines(out, 3), errs)
	}
	p.ApplyPerSecond = float64(n) / p.ApplySeconds
	waitFor(t, 5*time.Minute, "every entry running", func() bool {
		st, err := getStatus(lead, 30*time.Second)
		return err == nil && st.EntriesTotal == n+1
	})
	standby := c.startReplica("r1", flags...)
	bootAt := time.Now()
	// A replica reads and parses every entry before it serves: at a
	// million, on a machine the leader shares, that takes a while.
	if err := standby.WaitHealthy(context.Background(), 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	p.StandbyBoot = time.Since(bootAt).Seconds()

	// Steady state.
	time.Sleep(10 * time.Second) // the first state writes of every entry
	lagBefore := lagBuckets(t, lead)
	firesBefore, _ := lead.Metric(`beatd_fires_total{entry="",result="ok"}`)
	heapProfile(t, lead, n, "leader-steady-start") // the base for the steady state's allocations
	pids := []int{lead.Proc().Pid(), standby.Proc().Pid(), etcd.Members[0].Proc().Pid()}
	cpuBefore := make([]time.Duration, len(pids))
	for i, pid := range pids {
		if st, err := soak.ReadProcStats(pid); err == nil {
			cpuBefore[i] = st.CPU
		}
	}
	// Where the steady state's CPU goes, on both replicas (with -scale-heap).
	leadProfiled := cpuProfileLater(t, lead, n, "leader-steady", 0)
	standbyProfiled := cpuProfileLater(t, standby, n, "standby-steady", 0)
	time.Sleep(*scaleSteady)
	for i, pid := range pids {
		if st, err := soak.ReadProcStats(pid); err == nil {
			p.SteadyCPU[i] = (st.CPU - cpuBefore[i]).Seconds() / scaleSteady.Seconds()
		}
	}
	<-leadProfiled // 20 s each: a -scale-steady shorter than that waits here
	<-standbyProfiled
	firesAfter, _ := lead.Metric(`beatd_fires_total{entry="",result="ok"}`)
	p.FiresPerSecond = (firesAfter - firesBefore) / scaleSteady.Seconds()
	lagAfter := lagBuckets(t, lead)
	p.LagP99 = lagP99(lagBefore, lagAfter)
	t.Logf("%d entries: steady fire lag, share of fires at or under each bound: %s", n, lagShares(lagBefore, lagAfter))
	if st, err := soak.ReadProcStats(lead.Proc().Pid()); err == nil {
		p.LeaderRSS = st.RSS
	}
	heapProfile(t, lead, n, "leader")
	if st, err := soak.ReadProcStats(etcd.Members[0].Proc().Pid()); err == nil {
		p.EtcdRSS = st.RSS
	}
	ctx := context.Background()
	if s, err := c.observer.Status(ctx, c.etcd[0]); err == nil {
		p.EtcdDBBytes = s.DbSize
	}
	if info, err := c.rdb.Info(ctx, "memory").Result(); err == nil {
		if m := regexp.MustCompile(`used_memory:(\d+)`).FindStringSubmatch(info); m != nil {
			p.BrokerBytes, _ = strconv.ParseInt(m[1], 10, 64)
		}
	}
	p.MetricsBytes = bodySize(t, lead.URL("/metrics"))
	p.StatusBytes = bodySize(t, lead.URL("/status"))
	p.ListPageBytes = bodySize(t, lead.URL("/api/v1/entries"))
	at := time.Now()
	p.ConsoleBytes = bodySize(t, lead.URL("/"))
	p.ConsoleSeconds = time.Since(at).Seconds()
	p.PutToFire = putToFire(t, c, lead)

	// kill -9 of the leader; the standby takes over.
	auditFrom := time.Now()
	lead.Kill()
	killed := time.Now()
	c.leader(lead.ID, 5*time.Minute)
	p.ElectedAfter = time.Since(killed).Seconds()
	waitFor(t, 5*time.Minute, "the new leader scheduling", func() bool { return logHas(standby, `"msg":"scheduling"`) })
	p.StartSeconds = logGap(t, standby, `"msg":"elected leader"`, `"msg":"scheduling"`)
	firesAtTakeover, _ := standby.Metric(`beatd_fires_total{entry="",result="ok"}`)
	waitFor(t, 2*time.Minute, "the new leader's first fire", func() bool {
		v, _ := standby.Metric(`beatd_fires_total{entry="",result="ok"}`)
		return v > firesAtTakeover || v > 0
	})
	p.FirstFireAfter = time.Since(killed).Seconds()
	time.Sleep(20 * time.Second)
	auditTo := time.Now().Add(-10 * time.Second) // slots up to here have been published
	if st, err := soak.ReadProcStats(standby.Proc().Pid()); err == nil {
		p.StandbyPeakRSS = st.HWM
	}
	heapProfile(t, standby, n, "new-leader")
	p.Audited, p.Duplicates, p.Missed = auditSlots(t, c, file, auditFrom.Add(-5*time.Second), auditTo)
	if p.Duplicates > 0 || p.Missed > 0 {
		t.Errorf("%d entries: %d duplicate and %d missed of %d slots across the failover", n, p.Duplicates, p.Missed, p.Audited)
	}
	standby.Kill()
	return p
}

// putToFire PUTs one new entry, firing every second on a queue of its
// own (the audit reads "celery"), and times it to its first message.
func putToFire(t *testing.T, c *cluster, r *replica) float64 {
	body := `{"task":"tasks.add","every":"1s","options":{"queue":"put-probe"}}`
	req, _ := http.NewRequest(http.MethodPut, r.URL("/api/v1/entries/put-probe"), strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer test-token")
	req.Header.Set("Content-Type", "application/json")
	put := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT: %s", resp.Status)
	}
	waitFor(t, 30*time.Second, "the PUT entry's first message", func() bool {
		n, err := c.rdb.LLen(t.Context(), "put-probe").Result()
		return err == nil && n > 0
	})
	return time.Since(put).Seconds()
}

// heapProfile saves r's heap profile in -scale-heap, when it is set, to
// see where a size's memory goes (and, against the steady state's first,
// what the steady state allocates: go tool pprof -sample_index
// alloc_space -diff_base).
func heapProfile(t *testing.T, r *replica, n int, role string) {
	if *scaleHeap != "" {
		saveProfile(t, r, "/debug/pprof/heap?gc=1", *scaleHeap, fmt.Sprintf("%d-%s.heap", n, role))
	}
}

// cpuProfileLater saves, in -scale-heap when it is set, a 20 s CPU
// profile of r taken after a wait (the middle of a bulk load); the
// channel closes when it is done.
func cpuProfileLater(t *testing.T, r *replica, n int, role string, after time.Duration) <-chan struct{} {
	done := make(chan struct{})
	if *scaleHeap == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		time.Sleep(after)
		saveProfile(t, r, "/debug/pprof/profile?seconds=20", *scaleHeap, fmt.Sprintf("%d-%s.cpu", n, role))
	}()
	return done
}

// saveProfile writes r's profile at path to file in dir; a failure is
// logged, as a profile is an aid, not a measurement.
func saveProfile(t *testing.T, r *replica, path, dir, file string) {
	req, _ := http.NewRequest(http.MethodGet, r.URL(path), nil)
	req.Header.Set("Authorization", "Bearer test-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Logf("profile %s: %v", file, err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
		t.Logf("profile %s: %v", file, err)
	}
}

func bodySize(t *testing.T, url string) int64 {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer test-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Logf("GET %s: %v", url, err)
		return 0
	}
	defer resp.Body.Close()
	n, _ := io.Copy(io.Discard, resp.Body)
	return n
}

// logGap is the time between the last line containing from and the next
// line containing to, in the replica's JSON log.
func logGap(t *testing.T, r *replica, from, to string) float64 {
	b, _ := os.ReadFile(r.LogPath)
	var at time.Time
	for _, line := range strings.Split(string(b), "\n") {
		var l struct {
			Time time.Time `json:"time"`
		}
		switch {
		case strings.Contains(line, from):
			if json.Unmarshal([]byte(line), &l) == nil {
				at = l.Time
			}
		case strings.Contains(line, to) && !at.IsZero():
			if json.Unmarshal([]byte(line), &l) == nil {
				return l.Time.Sub(at).Seconds()
			}
		}
	}
	t.Errorf("no %s after %s in %s", to, from, r.LogPath)
	return 0
}

// logTime is the time of the first line containing what in the
// replica's JSON log.
func logTime(t *testing.T, r *replica, what string) time.Time {
	b, _ := os.ReadFile(r.LogPath)
	for _, line := range strings.Split(string(b), "\n") {
		var l struct {
			Time time.Time `json:"time"`
		}
		if strings.Contains(line, what) && json.Unmarshal([]byte(line), &l) == nil {
			return l.Time
		}
	}
	t.Errorf("no %s in %s", what, r.LogPath)
	return time.Time{}
}

var lagBounds = []string{"0.001", "0.0025", "0.005", "0.01", "0.02", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "+Inf"}

func lagBuckets(t *testing.T, r *replica) []float64 {
	out := make([]float64, len(lagBounds))
	for i, le := range lagBounds {
		out[i], _ = r.Metric(`beatd_fire_lag_seconds_bucket{le="` + le + `"}`)
	}
	return out
}

// lagP99 is the bucket bound under which 99% of the fires between two
// readings of the histogram fell.
func lagP99(before, after []float64) string {
	total := after[len(after)-1] - before[len(before)-1]
	if total <= 0 {
		return "n/a"
	}
	for i := range after {
		if (after[i]-before[i])/total >= 0.99 {
			return lagBounds[i] + " s"
		}
	}
	return "+Inf"
}

// lagShares is the cumulative share of the fires between two readings of
// the histogram at each bound from 10 ms to 1 s: the bucket that holds the
// p99 says little of how close to the next bound it is.
func lagShares(before, after []float64) string {
	total := after[len(after)-1] - before[len(before)-1]
	if total <= 0 {
		return "n/a"
	}
	var parts []string
	for i, le := range lagBounds {
		if b, err := strconv.ParseFloat(le, 64); err == nil && b >= 0.01 && b <= 1 {
			parts = append(parts, fmt.Sprintf("≤ %s s %.2f%%", le, 100*(after[i]-before[i])/total))
		}
	}
	return fmt.Sprintf("%s (%.0f fires)", strings.Join(parts, ", "), total)
}

// auditSlots checks every slot of every entry of file due in [from, to]
// against what the Redis queue holds: each exactly once.
func auditSlots(t *testing.T, c *cluster, file string, from, to time.Time) (slots, dups, missed int) {
	cfg, err := config.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := chaos.ReadQueue(context.Background(), c.rdb, "celery")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, m := range msgs {
		got[m.Entry+"@"+strconv.FormatInt(m.Slot.UnixNano(), 10)]++
	}
	for _, e := range cfg.Entries {
		for s := e.Schedule.Next(from.Add(-time.Nanosecond)); !s.IsZero() && !s.After(to); s = e.Schedule.Next(s) {
			slots++
			switch k := got[e.Name+"@"+strconv.FormatInt(s.UnixNano(), 10)]; {
			case k == 0:
				missed++
				if missed <= 5 {
					t.Logf("missed: %s at %s", e.Name, s.UTC().Format(time.RFC3339))
				}
			case k > 1:
				dups++
			}
		}
	}
	return slots, dups, missed
}
