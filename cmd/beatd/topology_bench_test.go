package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/soak"
	"github.com/beatd/beatd/testkit/testutil"
)

// The topologies bench-scale compares: etcd in the beatd process (beatd's
// default, --data-dir) and the etcd binary beside it (--etcd-endpoints).
const (
	topologyEmbedded = "embedded"
	topologyExternal = "external"
)

// topologyPoint is one size on one topology: a restart of a loaded
// single replica.
type topologyPoint struct {
	Topology string
	Entries  int
	// ApplySeconds is the bulk load through the API.
	ApplySeconds float64
	// From the restarted process's start, and from its election, to
	// scheduling every entry.
	StartToScheduling, ElectedToScheduling float64
	// The beatd process (etcd included when embedded) after the restart
	// and ten seconds of scheduling: its peak and its resident set.
	PeakRSS, RSS int64
	// The etcd binary's, when separate: its peak over its whole life (the
	// bulk load's) and its resident set after the restart.
	EtcdPeakRSS, EtcdRSS int64
	EtcdDB               int64
}

// TestBenchTopology measures, at each of -scale-sizes runtime entries and
// on each topology, a restart of one loaded replica: from its process
// start to scheduling, its peak RSS (and etcd's where separate), and
// etcd's DB.
func TestBenchTopology(t *testing.T) {
	if !*benchScale {
		t.Skip("the scale benchmark is opt-in: make bench-scale (or go test ./cmd/beatd -run TestBenchTopology -args -bench-scale)")
	}
	var points []topologyPoint
	for _, s := range strings.Split(*scaleSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			t.Fatal(err)
		}
		for _, topo := range []string{topologyEmbedded, topologyExternal} {
			t.Run(topo+"/"+s, func(t *testing.T) { points = append(points, benchTopologyAt(t, n, topo)) })
		}
	}
	t.Logf("| entries | etcd | `entries apply` | restart: process start → scheduling | election → scheduling | beatd peak RSS | beatd RSS | etcd binary peak / RSS | beatd + etcd peak | etcd DB |")
	t.Logf("|---|---|---|---|---|---|---|---|---|---|")
	for _, p := range points {
		etcd, sum := "(in beatd)", mib(p.PeakRSS)
		if p.Topology == topologyExternal {
			etcd, sum = mib(p.EtcdPeakRSS)+" / "+mib(p.EtcdRSS), mib(p.PeakRSS+p.EtcdPeakRSS)
		}
		t.Logf("| %d | %s | %.1f s | %.1f s | %.1f s | %s | %s | %s | %s | %s |", p.Entries, p.Topology, p.ApplySeconds,
			p.StartToScheduling, p.ElectedToScheduling, mib(p.PeakRSS), mib(p.RSS), etcd, sum, mib(p.EtcdDB))
	}
}

func benchTopologyAt(t *testing.T, n int, topo string) topologyPoint {
	p := topologyPoint{Topology: topo, Entries: n}
	dir := t.TempDir()
	c := &cluster{t: t, redis: testutil.MustStartRedis(t), dir: dir, prefix: "/beatd/scale/"}
	c.rdb = c.redis.Client()
	c.config = filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(c.config, []byte("entries:\n  seed: {task: tasks.add, every: 1h}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var etcd *harness.EtcdCluster
	var where []string
	if topo == topologyExternal {
		etcd = startBenchEtcd(t, dir)
		c.etcd = []string{etcd.Members[0].ClientURL()}
		where = []string{"--etcd-endpoints", c.etcd[0]}
	} else {
		port := testutil.FreePort(t)
		c.etcd = []string{"http://127.0.0.1:" + strconv.Itoa(port)}
		where = []string{"--data-dir", filepath.Join(dir, "data"), "--etcd-client-port", strconv.Itoa(port),
			"--etcd-peer-port", strconv.Itoa(testutil.FreePort(t))}
	}
	start := func(inc int) *replica {
		r := newReplica(t, "r0", filepath.Join(dir, fmt.Sprintf("r0-%d.log", inc)))
		r.Args = append([]string{"run", "--config", c.config, "--broker", c.redis.URL(0), "--id", r.ID, "--prefix", c.prefix,
			"--http", "127.0.0.1:" + strconv.Itoa(r.HTTPPort), "--log-format", "json", "--lease-ttl", "5s", "--log-fires", "0"}, where...)
		c.replicas = append(c.replicas, r)
		r.start()
		return r
	}
	r := start(1)
	r.waitHealthy()
	c.observer = testutil.NewEtcdClient(t, c.etcd...)
	c.leader("", time.Minute)
	file := filepath.Join(dir, "tenants.yaml")
	tenantFile(t, file, n)
	began := time.Now()
	code, out, errs := c.apiCLI(r, "admin", "entries", "apply", "-f", file)
	p.ApplySeconds = time.Since(began).Seconds()
	if code != 0 || !strings.Contains(out, fmt.Sprintf("applied %d/%d entries", n, n)) {
		t.Fatalf("apply: exit %d\n%s\n%s", code, lastLines(out, 3), errs)
	}
	waitFor(t, 10*time.Minute, "every entry running", func() bool {
		st, err := getStatus(r, 30*time.Second)
		return err == nil && st.EntriesTotal == n+1
	})

	// The restart: SIGTERM (the state persisted, the lease resigned), then
	// a new process on the same etcd (the same data directory).
	r.Signal(syscall.SIGTERM)
	if !r.Wait(2 * time.Minute) {
		t.Fatal("r0 did not stop within 2 minutes of SIGTERM")
	}
	r = start(2)
	started := time.Now()
	waitFor(t, 10*time.Minute, "scheduling after the restart", func() bool { return logHas(r, `"msg":"scheduling"`) })
	p.StartToScheduling = logTime(t, r, `"msg":"scheduling"`).Sub(started).Seconds()
	p.ElectedToScheduling = logGap(t, r, `"msg":"elected leader"`, `"msg":"scheduling"`)
	startTimeline(t, r, started)
	time.Sleep(10 * time.Second) // the first state writes after the start
	if st, err := soak.ReadProcStats(r.Proc().Pid()); err == nil {
		p.PeakRSS, p.RSS = st.HWM, st.RSS
	}
	if etcd != nil {
		if st, err := soak.ReadProcStats(etcd.Members[0].Proc().Pid()); err == nil {
			p.EtcdPeakRSS, p.EtcdRSS = st.HWM, st.RSS
		}
	}
	if s, err := c.observer.Status(context.Background(), c.etcd[0]); err == nil {
		p.EtcdDB = s.DbSize
	}
	t.Logf("%s etcd, %d entries: restart to scheduling %.1f s (election to scheduling %.1f s), beatd peak RSS %s, etcd DB %s",
		topo, n, p.StartToScheduling, p.ElectedToScheduling, mib(p.PeakRSS), mib(p.EtcdDB))
	r.Kill()
	return p
}

// startTimeline logs the replica's log lines up to its scheduling, each
// at its offset from the process's start: where a start's time goes.
func startTimeline(t *testing.T, r *replica, started time.Time) {
	b, _ := os.ReadFile(r.LogPath)
	var steps []string
	for _, line := range strings.Split(string(b), "\n") {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg == "" {
			continue
		}
		// A message repeated (an entry added, per entry) is its first line.
		if msg, _, _ := strings.Cut(l.Msg, ":"); len(steps) == 0 || !strings.HasSuffix(steps[len(steps)-1], " "+msg) {
			steps = append(steps, fmt.Sprintf("%.2f s %s", l.Time.Sub(started).Seconds(), msg))
		}
		if l.Msg == "scheduling" {
			break
		}
	}
	t.Logf("%s's start: %s", r.ID, strings.Join(steps, "; "))
}
