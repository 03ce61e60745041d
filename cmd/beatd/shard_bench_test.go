package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/soak"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

var (
	benchShards    = flag.Bool("bench-shards", false, "run the sharded benchmark (make bench-shards)")
	shardsEntries  = flag.Int("shards-entries", 900000, "bench-shards: the tenant-style runtime entries")
	shardsCount    = flag.Int("shards-count", 16, "bench-shards: the shard count measured")
	shardsFrom     = flag.Int("shards-from", 8, "bench-shards: the shard count resized from, under load, to -shards-count")
	shardsReplicas = flag.Int("shards-replicas", 3, "bench-shards: the sharded replicas")
	shardsSteady   = flag.Duration("shards-steady", 30*time.Second, "bench-shards: each steady state measured, and the windows either side of the kill -9")
	shardsDir      = flag.String("shards-dir", "", "bench-shards: keep etcd's data and the replicas' logs in this directory (default: the test's, removed)")
	shardsHeap     = flag.String("shards-heap", "", "bench-shards: a directory for each replica's heap profile once balanced after the resize and when its figures are read")
	// etcd 3.5 and later snapshot every 10,000 raft entries by default;
	// the Debian etcd 3.4 the bench runs keeps 100,000 in memory. At
	// 10,000 etcd's RSS at 900,000 entries fell from ~5.4 to 3.4 GB, but
	// the bulk apply took 308 s instead of 164 s and the moves were no
	// faster (CHANGELOG, round 30), so the default is the binary's.
	shardsSnapshots = flag.Int("shards-etcd-snapshot-count", 0, "bench-shards: etcd's --snapshot-count (0: the binary's default)")
	shardsCPU       = flag.String("shards-cpu", "", "bench-shards: a directory for each replica's CPU profile across the fourth replica's join, and its execution trace across the leave (where a move's start goes)")
)

// benchTTL is the lease TTL of every replica of the sharded bench, as in
// bench-scale.
const benchTTL = 5 * time.Second

// TestBenchShards measures, in one run on the etcd binary and a Redis,
// -shards-entries tenant-style entries run by one leader and then by
// -shards-replicas replicas at --shards -shards-count: each one's start
// (from its election to its shards scheduling) and peak RSS; a resize
// from -shards-from under load; a kill -9 of one replica (when its shards
// fire again, and the others' entries' lag as the broker sees it); a
// replica that rejoins, a fourth that joins and leaves (every shard
// move); and an exactly-once audit of every slot across all of it.
func TestBenchShards(t *testing.T) {
	if !*benchShards {
		t.Skip("the sharded benchmark is opt-in: make bench-shards (or go test ./cmd/beatd -run TestBenchShards -args -bench-shards)")
	}
	b := newShardBench(t, *shardsEntries)
	b.single()
	b.resizeUnderLoad()
	b.killOne()
	b.joinAndLeave()
	b.audit()
	b.report()
}

// shardBench is one run of TestBenchShards.
type shardBench struct {
	t       *testing.T
	c       *cluster
	etcd    *harness.EtcdCluster
	n       int
	shards  int
	ids     []string // the sharded replicas
	tenants string   // the runtime entries' file
	probes  []string // entries every 1s, catchup all, in every shard
	feed    *arrivals
	stop    func()
	// runs is every process started, in order; live the one running for
	// each id.
	runs []*benchRun
	live map[string]*benchRun

	res shardBenchResult
}

// benchRun is one process of a replica, with a log of its own.
type benchRun struct {
	*replica
	started time.Time
	shards  int
	rss     *rssTrace
}

// rssTrace is a process's RSS sampled every 50 ms until it exits: when
// its peak came, which VmHWM does not say.
type rssTrace struct {
	mu      sync.Mutex
	peak    int64 // kB
	at      time.Time
	samples []rssSample
}

type rssSample struct {
	at time.Time
	kb int64
}

// around is the RSS sampled from before to after the peak, one sample in
// every, for the log: how fast it rose, and whether it fell at once.
func (tr *rssTrace) around(before, after time.Duration, every int) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	for i, s := range tr.samples {
		if i%every != 0 || s.at.Before(tr.at.Add(-before)) || s.at.After(tr.at.Add(after)) {
			continue
		}
		fmt.Fprintf(&b, " %+.2fs:%dM", s.at.Sub(tr.at).Seconds(), s.kb>>10)
	}
	return b.String()
}

// follow samples pid's VmRSS until the process is gone.
func (tr *rssTrace) follow(pid int) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				now := time.Now()
				tr.mu.Lock()
				tr.samples = append(tr.samples, rssSample{now, kb})
				if kb > tr.peak {
					tr.peak, tr.at = kb, now
				}
				tr.mu.Unlock()
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peakAt is when the process's RSS reached its peak, and the last line
// its log says before then (what it was doing), from the first line that
// is not about one entry.
func (r *benchRun) peakAt() (time.Time, string) {
	r.rss.mu.Lock()
	at := r.rss.at
	r.rss.mu.Unlock()
	b, _ := os.ReadFile(r.LogPath)
	var last string
	for line := range strings.Lines(string(b)) {
		var l struct {
			Time  time.Time `json:"time"`
			Msg   string    `json:"msg"`
			Shard *int      `json:"shard"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || strings.HasPrefix(l.Msg, "entry ") {
			continue
		}
		if l.Time.After(at) {
			break
		}
		last = fmt.Sprintf("%s, %.1f s before", l.Msg, at.Sub(l.Time).Seconds())
		if l.Shard != nil {
			last = fmt.Sprintf("shard %d: %s", *l.Shard, last)
		}
	}
	return at, last
}

type shardBenchResult struct {
	applySeconds float64
	single       replicaFigures
	// The resize under load: the stop of every replica, the resize, and
	// the start at the new count until every shard schedules.
	stopSeconds, resizeSeconds, downtimeSeconds float64
	resizeAudit                                 *chaos.Report
	resizeFrom                                  float64 // the first resize, 1 -> -shards-from
	sharded                                     []replicaFigures
	etcdDB, etcdRSS                             int64
	kill                                        killFigures
	rejoined                                    replicaFigures
	moves                                       map[string][]chaos.ShardMove
	audit                                       *chaos.Report
}

// replicaFigures is one replica's start and memory.
type replicaFigures struct {
	id     string
	shards []int
	// electedToScheduling is from the first election of a shard the
	// replica leads once balanced to the last of those shards scheduling;
	// startToScheduling from its process start to the same.
	electedToScheduling, startToScheduling float64
	// shardStarts is each of its shards' own election to scheduling.
	shardStarts chaos.Stats
	peakRSS     int64 // VmHWM after the steady state
	rss         int64
	lag         chaos.Stats // its entries', from slot to the broker
}

type killFigures struct {
	victim string
	shards []int
	// Per shard of the victim: from the kill to its new leader's
	// election, scheduling, and its entries' first message after the kill.
	elected, scheduling, firstFire map[int]float64
	// The share's start: the victim's own election to scheduling at the
	// start.
	shareStart float64
	// The other replicas' entries' lag before and after the kill.
	lagBefore, lagAfter chaos.Stats
}

func newShardBench(t *testing.T, n int) *shardBench {
	dir := *shardsDir
	if dir == "" {
		dir = t.TempDir()
	}
	var etcdArgs []string
	if *shardsSnapshots > 0 {
		etcdArgs = []string{"--snapshot-count", strconv.Itoa(*shardsSnapshots)}
	}
	c, etcd := benchCluster(t, dir, "/beatd/shards/", etcdArgs...)
	b := &shardBench{t: t, c: c, etcd: etcd, n: n, shards: *shardsCount, live: map[string]*benchRun{}}
	for i := range *shardsReplicas {
		b.ids = append(b.ids, string(rune('a'+i)))
	}
	// Probes fire every second in every shard of both counts, owed every
	// slot: the dense signal for when a shard fires again and for lag.
	var y strings.Builder
	y.WriteString("entries:\n")
	have := map[[2]int]int{}
	for i := 0; !probesCover(have, b.shards, *shardsFrom); i++ {
		name := fmt.Sprintf("probe-%03d", i)
		have[[2]int{b.shards, keys.ShardOf(name, b.shards)}]++
		have[[2]int{*shardsFrom, keys.ShardOf(name, *shardsFrom)}]++
		b.probes = append(b.probes, name)
		fmt.Fprintf(&y, "  %s: {task: tasks.probe, every: 1s, catchup: all}\n", name)
	}
	c.config = filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(c.config, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	b.tenants = filepath.Join(dir, "tenants.yaml")
	tenantFile(t, b.tenants, n)
	ctx, cancel := context.WithCancel(context.Background())
	b.feed = &arrivals{}
	done := make(chan struct{})
	go func() { defer close(done); b.feed.consume(ctx, c.rdb, "celery") }()
	b.stop = func() { cancel(); <-done }
	t.Cleanup(b.stop)
	return b
}

// probesCover says whether every shard of both counts has two probes.
func probesCover(have map[[2]int]int, counts ...int) bool {
	for _, n := range counts {
		for i := range n {
			if have[[2]int{n, i}] < 2 {
				return false
			}
		}
	}
	return true
}

// start starts a process of replica id at shards, with a log of its own.
func (b *shardBench) start(id string, shards int) *benchRun {
	c := b.c
	inc := 1
	for _, r := range b.runs {
		if r.ID == id {
			inc++
		}
	}
	r := newReplica(b.t, id, filepath.Join(c.dir, fmt.Sprintf("%s-%d.log", id, inc)))
	r.Args = []string{"run", "--config", c.config, "--etcd-endpoints", strings.Join(c.etcd, ","), "--broker", c.redis.URL(0),
		"--id", id, "--prefix", c.prefix, "--http", "127.0.0.1:" + strconv.Itoa(r.HTTPPort), "--log-format", "json",
		"--lease-ttl", benchTTL.String(), "--log-fires", "0", "--shards", strconv.Itoa(shards),
		"--shard-drain-timeout", benchDrain(b.n, shards).String()}
	c.replicas = append(c.replicas, r)
	run := &benchRun{replica: r, started: time.Now(), shards: shards, rss: &rssTrace{}}
	r.start()
	go run.rss.follow(r.Proc().Pid())
	b.runs = append(b.runs, run)
	b.live[id] = run
	return run
}

// benchDrain is the SIGTERM drain's budget the bench gives a replica of n
// entries over shards, as docs/shards.md tells an operator: the default
// 10 s while a shard's load takes a second or so, and ~1 ms an entry of a
// shard above that (a load here is 0.1–0.6 ms an entry, one at a time on
// each replica that takes the leaver's shards).
func benchDrain(n, shards int) time.Duration {
	if shards <= 1 {
		return 10 * time.Second // unsharded: no drain
	}
	return min(max(10*time.Second, time.Duration(n/shards)*time.Millisecond), 10*time.Minute)
}

// stopRuns sends SIGTERM to every live process of ids at once and waits
// for them: a graceful stop, every shard persisted and resigned.
func (b *shardBench) stopRuns(ids ...string) {
	for _, id := range ids {
		b.live[id].Signal(syscall.SIGTERM)
	}
	for _, id := range ids {
		if !b.live[id].Wait(2 * time.Minute) {
			b.t.Fatalf("%s did not stop within 2 minutes of SIGTERM", id)
		}
		delete(b.live, id)
	}
}

// leaders is who leads each of the cluster's shards, from etcd, with
// each term's token.
func (b *shardBench) leaders(shards int) map[int]election.Leader {
	out := map[int]election.Leader{}
	for i := range shards {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l, err := election.Observe(ctx, b.c.observer, keys.Shard(b.c.prefix, i, shards))
		cancel()
		if err == nil {
			out[i] = l
		}
	}
	return out
}

// ids is who leads each shard.
func ids(leaders map[int]election.Leader) map[int]string {
	out := map[int]string{}
	for s, l := range leaders {
		out[s] = l.ID
	}
	return out
}

// waitBalanced waits until live lead every shard, each its share, and
// each shard's current term is scheduling.
func (b *shardBench) waitBalanced(what string, live ...string) map[int]string {
	b.t.Helper()
	var leaders map[int]election.Leader
	testutil.EventuallyEvery(b.t, 10*time.Minute, 200*time.Millisecond, what, func() bool {
		leaders = b.leaders(b.shards)
		if !chaos.ShardsBalanced(ids(leaders), b.shards, live) {
			return false
		}
		scheduling := map[int]bool{}
		for _, e := range b.events() {
			if l := leaders[e.Shard]; e.Msg == chaos.ShardScheduling && e.Replica == l.ID && e.Token == l.Token {
				scheduling[e.Shard] = true
			}
		}
		return len(scheduling) == b.shards
	})
	b.t.Logf("%s: %v", what, ids(leaders))
	return ids(leaders)
}

// events is every shard event in every process's log, oldest first.
func (b *shardBench) events() []chaos.ShardEvent {
	var out []chaos.ShardEvent
	for _, r := range b.runs {
		f, err := os.Open(r.LogPath)
		if err != nil {
			continue
		}
		evs, err := chaos.ReadShardEvents(r.ID, f)
		f.Close()
		if err != nil {
			b.t.Logf("read %s: %v", r.LogPath, err)
		}
		out = append(out, evs...)
	}
	slices.SortStableFunc(out, func(a, b chaos.ShardEvent) int { return a.At.Compare(b.At) })
	return out
}

// single loads the entries through a single leader (one shard), restarts
// it, and measures its start and memory: the baseline.
func (b *shardBench) single() {
	t, c := b.t, b.c
	lead := b.start("single", 1)
	lead.waitHealthy()
	c.leader("", time.Minute)
	start := time.Now()
	code, out, errs := c.apiCLI(lead.replica, "admin", "entries", "apply", "-f", b.tenants)
	b.res.applySeconds = time.Since(start).Seconds()
	if code != 0 || !strings.Contains(out, fmt.Sprintf("applied %d/%d entries", b.n, b.n)) {
		t.Fatalf("apply: exit %d\n%s\n%s", code, lastLines(out, 3), errs)
	}
	total := b.n + len(b.probes)
	waitFor(t, 10*time.Minute, "every entry running", func() bool {
		st, err := getStatus(lead.replica, 30*time.Second)
		return err == nil && st.EntriesTotal == total
	})
	// The measured single leader is a process started on the loaded
	// cluster, as each sharded replica will be.
	b.stopRuns("single")
	lead = b.start("single", 1)
	waitFor(t, 10*time.Minute, "the single leader scheduling", func() bool { return logHas(lead.replica, `"msg":"scheduling"`) })
	steadyFrom := time.Now()
	time.Sleep(*shardsSteady)
	f := b.figures(lead, nil, steadyFrom, time.Now())
	f.electedToScheduling = logGap(t, lead.replica, `"msg":"elected leader"`, `"msg":"scheduling"`)
	f.startToScheduling = logTime(t, lead.replica, `"msg":"scheduling"`).Sub(lead.started).Seconds()
	b.res.single = f
	b.stopRuns("single")
}

// figures reads a live process's memory and its entries' lag in [from,
// to]: the entries of shards (all of them when nil).
func (b *shardBench) figures(r *benchRun, shards []int, from, to time.Time) replicaFigures {
	f := replicaFigures{id: r.ID, shards: shards}
	if st, err := soak.ReadProcStats(r.Proc().Pid()); err == nil {
		f.peakRSS, f.rss = st.HWM, st.RSS
	}
	if at, doing := r.peakAt(); !at.IsZero() {
		b.t.Logf("%s: RSS peaked %.1f s after its start, after: %s; around it:%s", r.ID, at.Sub(r.started).Seconds(), doing,
			r.rss.around(3*time.Second, time.Second, 2))
	}
	if *shardsHeap != "" {
		saveProfile(b.t, r.replica, "/debug/pprof/heap?gc=1", *shardsHeap, fmt.Sprintf("%s-%d.heap", r.ID, len(b.runs)))
	}
	f.lag = b.feed.lag(from, to, func(entry string) bool {
		return shards == nil || slices.Contains(shards, keys.ShardOf(entry, b.shards))
	})
	return f
}

// resizeUnderLoad resizes the stopped cluster to -shards-from, runs the
// replicas there, then stops them, resizes to -shards-count and starts
// them again: the start measured against the single leader's.
func (b *shardBench) resizeUnderLoad() {
	t := b.t
	b.res.resizeFrom = b.resize(*shardsFrom)
	began := time.Now()
	for _, id := range b.ids {
		b.start(id, *shardsFrom)
	}
	shards := b.shards
	b.shards = *shardsFrom
	b.waitBalanced(fmt.Sprintf("%d replicas at %d shards", len(b.ids), b.shards), b.ids...)
	time.Sleep(5 * time.Second) // slots under the first count
	b.shards = shards

	stopAt := time.Now()
	b.stopRuns(b.ids...)
	b.res.stopSeconds = time.Since(stopAt).Seconds()
	b.res.resizeSeconds = b.resize(b.shards)
	began = time.Now()
	for _, id := range b.ids {
		b.start(id, b.shards)
	}
	leaders := b.waitBalanced(fmt.Sprintf("%d replicas at %d shards", len(b.ids), b.shards), b.ids...)
	if *shardsHeap != "" {
		for _, id := range b.ids { // each start's catch-up, against the steady state's after
			saveProfile(t, b.live[id].replica, "/debug/pprof/heap?gc=1", *shardsHeap, id+"-start.heap")
		}
	}
	evs := b.events()
	var last time.Time
	for _, e := range evs {
		if e.Msg == chaos.ShardScheduling && e.At.After(began) && e.At.After(last) {
			last = e.At
		}
	}
	b.res.downtimeSeconds = last.Sub(stopAt).Seconds()
	steadyFrom := time.Now()
	time.Sleep(*shardsSteady)
	for _, id := range b.ids {
		var mine []int
		for s, l := range leaders {
			if l == id {
				mine = append(mine, s)
			}
		}
		slices.Sort(mine)
		r := b.live[id]
		f := b.figures(r, mine, steadyFrom, time.Now())
		f.electedToScheduling, f.startToScheduling, f.shardStarts = shareStart(evs, id, mine, began, r.started)
		b.res.sharded = append(b.res.sharded, f)
	}
	if st, err := soak.ReadProcStats(b.etcd.Members[0].Proc().Pid()); err == nil {
		b.res.etcdRSS = st.RSS
	}
	if s, err := b.c.observer.Status(context.Background(), b.c.etcd[0]); err == nil {
		b.res.etcdDB = s.DbSize
	}
	// The resize's own audit: every slot from before the stop to the
	// steady state after.
	b.res.resizeAudit = b.auditWindow(stopAt.Add(-5*time.Second), steadyFrom)
	t.Logf("resize %d -> %d under load: stop %.1f s, resize %.1f s, stop to every shard scheduling %.1f s; %d slots, %d duplicate, %d missed, %d dropped by catch-up policy",
		*shardsFrom, b.shards, b.res.stopSeconds, b.res.resizeSeconds, b.res.downtimeSeconds,
		b.res.resizeAudit.ExpectedSlots, len(b.res.resizeAudit.Duplicates), len(b.res.resizeAudit.Missed), len(b.res.resizeAudit.Dropped))
}

// shareStart is a replica's start of its shards (mine) after began: from
// the first election among them to the last of them scheduling, from its
// process start to the same, and each shard's own election to scheduling.
func shareStart(evs []chaos.ShardEvent, id string, mine []int, began, started time.Time) (elected, fromStart float64, each chaos.Stats) {
	var first, last time.Time
	var gaps []time.Duration
	for _, s := range mine {
		var el, sc time.Time
		for _, e := range evs {
			if e.Replica != id || e.Shard != s || !e.At.After(began) {
				continue
			}
			switch {
			case e.Msg == chaos.ShardElected:
				el, sc = e.At, time.Time{} // the last term's
			case e.Msg == chaos.ShardScheduling && sc.IsZero():
				sc = e.At
			}
		}
		if el.IsZero() || sc.IsZero() {
			continue
		}
		gaps = append(gaps, sc.Sub(el))
		if first.IsZero() || el.Before(first) {
			first = el
		}
		if sc.After(last) {
			last = sc
		}
	}
	return last.Sub(first).Seconds(), last.Sub(started).Seconds(), chaos.StatsOf(gaps)
}

// resize runs `beatd shards resize m` on the stopped cluster and times it;
// at 900,000 entries it takes more than the command's default minute. A
// resize that fails is rerun with the same count once its lock's lease
// (10 s) has expired, as docs/shards.md says to finish one that died;
// every failure is logged and counted in the time.
func (b *shardBench) resize(m int) float64 {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		out, err := exec.Command(beatdBin, "shards", "resize", strconv.Itoa(m), "--etcd-endpoints", strings.Join(b.c.etcd, ","), "--prefix", b.c.prefix,
			"--timeout", "30m", "--broker", b.c.redis.URL(0)).CombinedOutput()
		if err == nil {
			took := time.Since(start).Seconds()
			b.t.Logf("beatd shards resize %d: %.2f s in %d attempts: %s", m, took, attempt, strings.TrimSpace(string(out)))
			return took
		}
		b.t.Logf("beatd shards resize %d, attempt %d, failed after %.1f s: %v\n%s", m, attempt, time.Since(start).Seconds(), err, out)
		// etcd can answer "request timed out" to the last transaction
		// (the count written, the staging table deleted) and still apply
		// it: then the rerun finds the count done.
		if attempt > 1 && strings.Contains(string(out), fmt.Sprintf("has a shard count of %d already", m)) {
			took := time.Since(start).Seconds()
			b.t.Logf("beatd shards resize %d: done by the first attempt's last transaction, %.2f s", m, took)
			return took
		}
		if attempt == 4 {
			b.t.Fatalf("beatd shards resize %d failed %d times", m, attempt)
		}
		time.Sleep(11 * time.Second)
	}
}

// killOne kills the last replica with kill -9 and measures when each of
// its shards fires again, and the others' entries' lag either side.
func (b *shardBench) killOne() {
	victim := b.ids[len(b.ids)-1]
	others := b.ids[:len(b.ids)-1]
	leaders := ids(b.leaders(b.shards))
	k := &b.res.kill
	k.victim = victim
	for s, id := range leaders {
		if id == victim {
			k.shards = append(k.shards, s)
		}
	}
	slices.Sort(k.shards)
	for _, f := range b.res.sharded {
		if f.id == victim {
			k.shareStart = f.electedToScheduling
		}
	}
	theirs := func(entry string) bool { return !slices.Contains(k.shards, keys.ShardOf(entry, b.shards)) }
	// The lag before the kill is a quiet window's: the bench's own work
	// just before (each replica's heap profile, a forced collection of
	// a few hundred MB, and the resize's audit read from Redis) once put
	// a p99 of 1 s in it.
	time.Sleep(*shardsSteady)
	killed := time.Now()
	b.live[victim].Kill()
	delete(b.live, victim)
	b.waitBalanced(fmt.Sprintf("%s killed (TTL %s)", victim, benchTTL), others...)
	time.Sleep(*shardsSteady)
	k.lagBefore = b.feed.lag(killed.Add(-*shardsSteady), killed, theirs)
	k.lagAfter = b.feed.lag(killed, killed.Add(*shardsSteady), theirs)
	k.elected, k.scheduling, k.firstFire = map[int]float64{}, map[int]float64{}, map[int]float64{}
	for _, e := range b.events() {
		if !e.At.After(killed) || !slices.Contains(k.shards, e.Shard) {
			continue
		}
		m := k.scheduling
		if e.Msg == chaos.ShardElected {
			m = k.elected
		} else if e.Msg != chaos.ShardScheduling {
			continue
		}
		if _, ok := m[e.Shard]; !ok {
			m[e.Shard] = e.At.Sub(killed).Seconds()
		}
	}
	for s, at := range b.feed.firstAfter(killed, func(entry string) int { return keys.ShardOf(entry, b.shards) }) {
		if slices.Contains(k.shards, s) {
			k.firstFire[s] = at.Sub(killed).Seconds()
		}
	}
}

// joinAndLeave restarts the killed replica, then starts a fourth, then
// stops that one with SIGTERM; each shard move is timed.
func (b *shardBench) joinAndLeave() {
	victim := b.res.kill.victim
	mark := time.Now()
	run := b.start(victim, b.shards)
	leaders := b.waitBalanced(victim+" rejoined", b.ids...)
	// A replica that joins a running cluster is handed its share alone:
	// its memory and start are the share's, with no cold start's race
	// for every shard in them.
	steadyFrom := time.Now()
	time.Sleep(*shardsSteady / 2)
	var mine []int
	for s, l := range leaders {
		if l == victim {
			mine = append(mine, s)
		}
	}
	slices.Sort(mine)
	f := b.figures(run, mine, steadyFrom, time.Now())
	f.id += " (rejoined)"
	f.electedToScheduling, f.startToScheduling, f.shardStarts = shareStart(b.events(), victim, mine, mark, run.started)
	b.res.rejoined = f
	rejoined := time.Now()
	fourth := string(rune('a' + len(b.ids)))
	profiled := b.profileCPU(50*time.Second, "join", b.ids...)
	b.start(fourth, b.shards)
	b.waitBalanced(fourth+" joined", append(slices.Clone(b.ids), fourth)...)
	time.Sleep(3 * time.Second)
	for _, wait := range profiled {
		wait()
	}
	profiled = b.profileCPU(30*time.Second, "leave", b.ids...)
	left := time.Now()
	b.stopRuns(fourth)
	b.waitBalanced(fourth+" left (SIGTERM)", b.ids...)
	time.Sleep(3 * time.Second)
	for _, wait := range profiled {
		wait()
	}
	b.res.moves = map[string][]chaos.ShardMove{}
	for _, m := range chaos.ShardMoves(b.events()) {
		switch {
		case m.Released.After(left):
			b.res.moves[fourth+" leaves"] = append(b.res.moves[fourth+" leaves"], m)
		case m.Released.After(rejoined):
			b.res.moves[fourth+" joins"] = append(b.res.moves[fourth+" joins"], m)
		case m.Released.After(mark):
			b.res.moves[victim+" rejoins"] = append(b.res.moves[victim+" rejoins"], m)
		}
	}
}

// profileCPU starts a CPU profile of each replica for d (under the HTTP
// server's write timeout, a minute), written to -shards-cpu as
// ID-PHASE.cpu when it ends, or for the leave its execution trace
// (ID-leave.trace); the returned waits wait for that (none without the
// flag). The replicas must outlive d: pprof's handler writes a profile
// only at its end.
func (b *shardBench) profileCPU(d time.Duration, phase string, ids ...string) []func() {
	if *shardsCPU == "" {
		return nil
	}
	var waits []func()
	for _, id := range ids {
		r := b.live[id].replica
		done := make(chan struct{})
		go func() {
			defer close(done)
			kind, ext := "profile", ".cpu"
			if phase == "leave" {
				kind, ext = "trace", ".trace"
			}
			saveProfile(b.t, r, fmt.Sprintf("/debug/pprof/%s?seconds=%d", kind, int(d.Seconds())), *shardsCPU, id+"-"+phase+ext)
		}()
		waits = append(waits, func() { <-done })
	}
	return waits
}

// auditWindow audits the slots in [from, to] of every entry against what
// the broker delivered (waiting until slots up to to have had 10 s),
// judging takeovers by the terms in the processes' logs: the tokens alone
// cannot tell a slot a takeover's catch-up dropped when the entry
// published nothing before it (one defined just after its previous slot,
// whose first slot fell in an outage).
func (b *shardBench) auditWindow(from, to time.Time) *chaos.Report {
	if wait := time.Until(to.Add(10 * time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	cfg := b.entries()
	return chaos.AuditWithTerms(cfg, b.feed.messages(), from, to, b.terms())
}

// terms is every term elected in every process's log, each with the
// shard count its process ran at.
func (b *shardBench) terms() []chaos.Term {
	var out []chaos.Term
	for _, r := range b.runs {
		f, err := os.Open(r.LogPath)
		if err != nil {
			b.t.Fatalf("terms: %v", err)
		}
		ts, err := chaos.ReadTerms(f, r.shards)
		f.Close()
		if err != nil {
			b.t.Fatalf("terms of %s: %v", r.LogPath, err)
		}
		out = append(out, ts...)
	}
	return out
}

// entries is the probes and the tenants, as one config.
func (b *shardBench) entries() *config.Config {
	cfg, err := config.LoadFile(b.c.config)
	if err != nil {
		b.t.Fatal(err)
	}
	tenants, err := config.LoadFile(b.tenants)
	if err != nil {
		b.t.Fatal(err)
	}
	cfg.Entries = append(cfg.Entries, tenants.Entries...)
	return cfg
}

// audit checks every slot from the single leader's restart to now.
func (b *shardBench) audit() {
	var from time.Time
	for _, r := range b.runs {
		if r.ID == "single" {
			from = r.started
		}
	}
	b.res.audit = b.auditWindow(from.Add(time.Duration(b.res.single.startToScheduling*float64(time.Second))).Add(time.Second), time.Now().Add(-10*time.Second))
	for _, r := range []*chaos.Report{b.res.resizeAudit, b.res.audit} {
		for i, d := range r.Duplicates {
			if i < 5 {
				b.t.Errorf("duplicate: %s at %s, %d times", d.Entry, d.Slot.Format(time.RFC3339), d.Count)
			}
		}
		for i, m := range r.Missed {
			if i < 5 {
				b.t.Errorf("missed: %s at %s", m.Entry, m.Slot.Format(time.RFC3339))
			}
		}
	}
}

func (b *shardBench) report() {
	t, r := b.t, &b.res
	ms := func(s chaos.Stats) string {
		return fmt.Sprintf("%.0f / %.0f / %.0f ms", s.P50*1000, s.P99*1000, s.Max*1000)
	}
	t.Logf("%d entries (%d probes every 1 s), apply %.1f s (%.0f/s); resize 1 -> %d %.1f s; etcd DB %s, etcd RSS %s at %d shards",
		b.n, len(b.probes), r.applySeconds, float64(b.n)/r.applySeconds, *shardsFrom, r.resizeFrom, mib(r.etcdDB), mib(r.etcdRSS), b.shards)
	t.Logf("| replica | shards | election → scheduling | process start → scheduling | each shard's election → scheduling (p50 / max) | peak RSS | RSS | lag p50 / p99 / max |")
	t.Logf("|---|---|---|---|---|---|---|---|")
	row := func(f replicaFigures, shards, each string) {
		t.Logf("| %s | %s | %.2f s | %.2f s | %s | %s | %s | %s |", f.id, shards, f.electedToScheduling, f.startToScheduling,
			each, mib(f.peakRSS), mib(f.rss), ms(f.lag))
	}
	row(r.single, "all (1)", "—")
	for _, f := range append(slices.Clone(r.sharded), r.rejoined) {
		row(f, fmt.Sprint(f.shards), fmt.Sprintf("%.2f / %.2f s", f.shardStarts.P50, f.shardStarts.Max))
	}
	// A leader's election to scheduling is how long what it won stays
	// led but not scheduling: for the single leader its one shard, for a
	// replica each of its shards, the longest counted; the span from its
	// first election to its last shard scheduling is shown beside it
	// (its shards are won one by one, each once its entries are loaded).
	for _, f := range append(slices.Clone(r.sharded), r.rejoined) {
		rss, start := float64(f.peakRSS)/float64(r.single.peakRSS), f.shardStarts.Max/r.single.electedToScheduling
		t.Logf("%s: peak RSS %.0f%% of the single leader's (target ≤ 45%%: %s), a shard's election → scheduling at most %.0f%% (target ≤ 40%%: %s), first election → last scheduling %.0f%%", f.id,
			100*rss, verdict(rss <= 0.45), 100*start, verdict(start <= 0.40), 100*f.electedToScheduling/r.single.electedToScheduling)
	}
	k := r.kill
	t.Logf("kill -9 of %s (shards %v, TTL %s, its share's start %.2f s): the others' entries' lag before %s, after %s", k.victim, k.shards, benchTTL,
		k.shareStart, ms(k.lagBefore), ms(k.lagAfter))
	for _, s := range k.shards {
		bound := benchTTL.Seconds() + k.shareStart
		t.Logf("  shard %d: elected %.2f s, scheduling %.2f s, first message %.2f s after the kill (TTL + share start = %.2f s: %s)",
			s, k.elected[s], k.scheduling[s], k.firstFire[s], bound, verdict(k.firstFire[s] > 0 && k.firstFire[s] <= bound))
	}
	for _, what := range slices.Sorted(func(yield func(string) bool) {
		for k := range r.moves {
			if !yield(k) {
				return
			}
		}
	}) {
		var gaps []time.Duration
		for _, m := range r.moves[what] {
			gaps = append(gaps, m.Gap())
		}
		s := chaos.StatsOf(gaps)
		t.Logf("%s: %d moves, release → scheduling p50 %.0f ms, max %.0f ms (target ≤ 1 s: %s): %v", what, s.Count, s.P50*1000, s.Max*1000,
			verdict(s.Max <= 1), r.moves[what])
	}
	for name, a := range map[string]*chaos.Report{"resize under load": r.resizeAudit, "the whole run": r.audit} {
		t.Logf("audit of %s (%s .. %s): %d slots, %d messages, %d duplicate, %d missed, %d dropped by catch-up policy", name,
			a.From.Format(time.TimeOnly), a.To.Format(time.TimeOnly), a.ExpectedSlots, a.Messages, len(a.Duplicates), len(a.Missed), len(a.Dropped))
	}
}

func verdict(ok bool) string {
	if ok {
		return "pass"
	}
	return "FAIL"
}

// arrivals is every beatd message taken from a queue, with when: the
// broker's view of each slot's lag.
type arrivals struct {
	mu   sync.Mutex
	list []arrival
}

type arrival struct {
	chaos.Message
	At time.Time
}

// consume takes the queue's messages, oldest first, until ctx ends;
// polling at most 10 ms apart, so an arrival is late by at most that.
func (a *arrivals) consume(ctx context.Context, rdb *redis.Client, queue string) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		raws, err := rdb.RPopCount(ctx, queue, 1000).Result()
		now := time.Now()
		if err == nil {
			a.mu.Lock()
			for _, raw := range raws {
				if m, ok := chaos.ParseMessage([]byte(raw)); ok {
					a.list = append(a.list, arrival{Message: m, At: now})
				}
			}
			a.mu.Unlock()
			if len(raws) == 1000 {
				continue
			}
		} else if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (a *arrivals) messages() []chaos.Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]chaos.Message, len(a.list))
	for i, m := range a.list {
		out[i] = m.Message
	}
	return out
}

// lag is how late the messages of the entries that match arrived after
// their slots, for the slots in [from, to).
func (a *arrivals) lag(from, to time.Time, match func(entry string) bool) chaos.Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ds []time.Duration
	for _, m := range a.list {
		if !m.Slot.Before(from) && m.Slot.Before(to) && match(m.Entry) {
			ds = append(ds, m.At.Sub(m.Slot))
		}
	}
	return chaos.StatsOf(ds)
}

// firstAfter is, for each shard (shardOf each entry), the first arrival
// after t.
func (a *arrivals) firstAfter(t time.Time, shardOf func(entry string) int) map[int]time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[int]time.Time{}
	for _, m := range a.list {
		if !m.At.After(t) {
			continue
		}
		s := shardOf(m.Entry)
		if at, ok := out[s]; !ok || m.At.Before(at) {
			out[s] = m.At
		}
	}
	return out
}
