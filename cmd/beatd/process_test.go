package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// These tests run the built binary as separate processes against a real
// etcd and a real redis-server.

var beatdBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if fuzzing() {
		// make fuzz runs only a fuzz target, in a process per worker:
		// building the binary in each would eat its few seconds.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "beatd-bin")
	if err != nil {
		panic(err)
	}
	beatdBin = filepath.Join(dir, "beatd")
	widenParallel()
	if err := harness.BuildBeatd(beatdBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// parallelTests is how many of this package's parallel tests run at
// once unless -parallel says otherwise. They start their own servers and
// beatd processes and spend most of their time waiting on a scenario (a
// crontab boundary, a lease TTL, a RabbitMQ restart): about a third of a
// core each, under -race. go test's default, GOMAXPROCS (2 on the CI
// machine), left the package's tests a minute and more of waiting one
// behind another. The tests whose assertions time something on the wall
// clock stay serial, and so still run alone.
const parallelTests = 4

// widenParallel sets -test.parallel to parallelTests if the command line
// left it at its default.
func widenParallel() {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelTests)); err != nil {
			panic(err)
		}
	}
}

// fuzzing says whether this process fuzzes (go test -fuzz, or one of its
// workers), when no test that runs the binary runs.
func fuzzing() bool {
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}

// replica is a beatd process owned by a test: it is killed when the test
// ends, and a failure to start fails the test.
type replica struct {
	*harness.Replica
	t *testing.T
}

// newReplica configures, without starting it, replica id of beatdBin,
// with an HTTP port of its own and the admin token test-token.
func newReplica(t *testing.T, id, logPath string) *replica {
	r := &replica{t: t, Replica: &harness.Replica{ID: id, Bin: beatdBin, HTTPPort: testutil.FreePort(t), LogPath: logPath,
		Env: []string{"BEATD_ADMIN_TOKEN=test-token"}}}
	t.Cleanup(r.Kill)
	return r
}

// cluster is N beatd replicas sharing one etcd and one Redis.
type cluster struct {
	t        *testing.T
	etcd     []string
	redis    *testutil.Redis
	rdb      *redis.Client
	dir      string
	config   string
	replicas []*replica
	prefix   string
	// observer reads the leader key. It is made once: the failover asserts
	// time leader(), which must not include dialling etcd.
	observer *clientv3.Client
	// env is added to each replica's environment.
	env []string
}

func newCluster(t *testing.T, config string, n int, extra ...string) *cluster {
	t.Helper()
	return newClusterEnv(t, config, nil, n, extra...)
}

// newClusterEnv is newCluster whose replicas get env added to their
// environment: a parallel test cannot t.Setenv.
func newClusterEnv(t *testing.T, config string, env []string, n int, extra ...string) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("runs beatd processes")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	c := &cluster{t: t, etcd: srv.Endpoints, redis: testutil.MustStartRedis(t), dir: t.TempDir(), prefix: "/beatd/proc/", env: env}
	c.rdb = c.redis.Client()
	c.observer = testutil.NewEtcdClient(t, c.etcd...)
	c.config = filepath.Join(c.dir, "schedules.yaml")
	if err := os.WriteFile(c.config, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range c.replicas {
				b, _ := os.ReadFile(r.LogPath)
				lines := strings.Split(string(b), "\n")
				if len(lines) > 40 {
					lines = lines[len(lines)-40:]
				}
				t.Logf("--- %s log tail ---\n%s", r.ID, strings.Join(lines, "\n"))
			}
		}
	})
	for i := 0; i < n; i++ {
		c.startReplica(fmt.Sprintf("r%d", i), extra...)
	}
	for _, r := range c.replicas {
		r.waitHealthy()
	}
	return c
}

// startReplica starts one more replica of the cluster; extra flags
// override the defaults.
func (c *cluster) startReplica(id string, extra ...string) *replica {
	r := newReplica(c.t, id, filepath.Join(c.dir, id+".log"))
	r.Env = append(r.Env, c.env...)
	r.Args = append([]string{"run", "--config", c.config, "--etcd-endpoints", strings.Join(c.etcd, ","),
		"--broker", c.redis.URL(0), "--id", r.ID, "--lease-ttl", "2s", "--prefix", c.prefix,
		"--http", "127.0.0.1:" + strconv.Itoa(r.HTTPPort), "--log-format", "json"}, extra...)
	c.replicas = append(c.replicas, r)
	r.start()
	return r
}

// waitHealthy waits until the replica serves /healthz.
func (r *replica) waitHealthy() {
	r.t.Helper()
	if err := r.WaitHealthy(context.Background(), 30*time.Second); err != nil {
		r.t.Fatal(err)
	}
}

func (r *replica) start() {
	r.t.Helper()
	if err := r.Start(); err != nil {
		r.t.Fatal(err)
	}
}

// leader waits until etcd shows a leader other than not, and returns it.
func (c *cluster) leader(not string, timeout time.Duration) (*replica, election.Leader) {
	c.t.Helper()
	var lead *replica
	var l election.Leader
	testutil.EventuallyEvery(c.t, timeout, 20*time.Millisecond, fmt.Sprintf("a leader other than %q", not), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		if l, err = election.Observe(ctx, c.observer, c.prefix); err != nil || l.ID == not {
			return false
		}
		for _, r := range c.replicas {
			if r.ID == l.ID {
				lead = r
				return true
			}
		}
		return false
	})
	return lead, l
}

// stopAll stops every replica gracefully and waits for them.
func (c *cluster) stopAll() {
	for _, r := range c.replicas {
		r.Signal(syscall.SIGTERM)
	}
	for _, r := range c.replicas {
		<-r.Done()
	}
}

// audit reads every beatd message in the given queues.
func (c *cluster) audit(queues ...string) []chaos.Message {
	c.t.Helper()
	var out []chaos.Message
	for _, q := range queues {
		msgs, err := chaos.ReadQueue(context.Background(), c.rdb, q)
		if err != nil {
			c.t.Fatal(err)
		}
		out = append(out, msgs...)
	}
	return out
}

// checkExactlyOnce audits the messages against the cluster's config for
// the slots in [from, to], as a drill does.
func (c *cluster) checkExactlyOnce(msgs []chaos.Message, from, to time.Time) {
	c.t.Helper()
	cfg, err := config.LoadFile(c.config)
	if err != nil {
		c.t.Fatal(err)
	}
	rep := chaos.Audit(cfg, msgs, from, to)
	if len(rep.Duplicates) > 0 {
		c.t.Errorf("duplicate slots: %v", rep.Duplicates)
	}
	if len(rep.Missed) > 0 {
		c.t.Errorf("missed slots: %v", rep.Missed)
	}
	if rep.ExpectedSlots == 0 {
		c.t.Error("no slots audited")
	}
}

const failoverConfig = `entries:
  a: {task: tasks.add, every: 1s, args: [1, 1], catchup: all}
  b: {task: tasks.add, every: 1s, args: [2, 2], catchup: all}
  c: {task: tasks.add, every: 1s, args: [3, 3], catchup: all, options: {queue: other}}
`

func TestProcessKillLeader(t *testing.T) {
	c := newCluster(t, failoverConfig, 3)
	lead, l := c.leader("", 20*time.Second)
	start := time.Now()
	c.publishedThrough(start.Add(2*time.Second), 15*time.Second)
	killed := time.Now()
	lead.Signal(syscall.SIGKILL)
	<-lead.Done()
	_, l2 := c.leader(lead.ID, 10*time.Second)
	gap := time.Since(killed)
	if l2.Token <= l.Token {
		t.Errorf("new token %d not above %d", l2.Token, l.Token)
	}
	// Lease TTL 2s: the new leader must exist within TTL + 1s.
	if gap > 3*time.Second {
		t.Errorf("failover took %s, want within the 2s TTL + 1s", gap)
	}
	end := c.publishedThrough(time.Now().Add(2*time.Second), 15*time.Second)
	c.stopAll()
	msgs := c.audit("celery", "other")
	c.checkExactlyOnce(msgs, start.Add(time.Second), end.Add(-time.Second))
	t.Logf("kill -9 failover: new leader after %s; %d messages, tokens %d -> %d", gap.Round(time.Millisecond), len(msgs), l.Token, l2.Token)
}

func TestProcessStopLeaderPastTTL(t *testing.T) {
	// Its own etcd and Redis; it judges tokens and the audit, and times
	// nothing on the wall clock (the deposed leader's in-flight slots are
	// judged against when it was stopped, as a slot's due time).
	t.Parallel()
	c := newCluster(t, failoverConfig, 3)
	lead, l := c.leader("", 20*time.Second)
	start := time.Now()
	c.publishedThrough(start.Add(time.Second), 15*time.Second)
	lead.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	_, l2 := c.leader(lead.ID, 10*time.Second)
	// Keep it frozen until the new leader has published well past the 2s
	// TTL, then wake it: it must notice it is deposed and stand by.
	c.publishedThrough(stopped.Add(3*time.Second), 15*time.Second)
	lead.Signal(syscall.SIGCONT)
	waitFor(t, 10*time.Second, "the woken leader to stand by", func() bool {
		v, ok := lead.Metric("beatd_is_leader")
		return ok && v == 0
	})
	end := c.publishedThrough(time.Now().Add(2*time.Second), 15*time.Second)
	c.stopAll()
	msgs := c.audit("celery", "other")
	c.checkExactlyOnce(msgs, start.Add(time.Second), end.Add(-time.Second))
	// Whatever the stopped leader had in flight when it froze may have
	// landed; nothing due after it froze may carry its token, since the
	// new leader's fence refuses it once it wakes.
	for _, m := range msgs {
		if m.Token == l.Token && m.Slot.After(stopped.Add(500*time.Millisecond)) {
			t.Errorf("the deposed leader published slot %v after it was stopped at %v", m.Slot, stopped)
		}
	}
	t.Logf("SIGSTOP: tokens %d -> %d, %d messages, no duplicates", l.Token, l2.Token, len(msgs))
}

func TestProcessSIGTERMHandover(t *testing.T) {
	c := newCluster(t, failoverConfig, 3)
	lead, l := c.leader("", 20*time.Second)
	start := time.Now()
	c.publishedThrough(start.Add(time.Second), 15*time.Second)
	sent := time.Now()
	lead.Signal(syscall.SIGTERM)
	_, l2 := c.leader(lead.ID, 5*time.Second)
	handover := time.Since(sent)
	if handover > time.Second {
		t.Errorf("SIGTERM handover took %s, want under 1s", handover)
	}
	select {
	case <-lead.Done():
		if lead.ExitCode() != 0 {
			t.Errorf("exit code %d after SIGTERM", lead.ExitCode())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not exit after SIGTERM")
	}
	end := c.publishedThrough(time.Now().Add(2*time.Second), 15*time.Second)
	c.stopAll()
	c.checkExactlyOnce(c.audit("celery", "other"), start.Add(time.Second), end.Add(-time.Second))
	t.Logf("SIGTERM handover in %s (tokens %d -> %d)", handover.Round(time.Millisecond), l.Token, l2.Token)
}

func TestProcessHotReload(t *testing.T) {
	// Its own etcd and Redis; it judges what fires, not how fast.
	t.Parallel()
	c := newCluster(t, "entries:\n  a: {task: tasks.add, every: 1s, args: [1, 1]}\n", 1)
	lead, _ := c.leader("", 20*time.Second)
	// A good file: entry b appears and fires.
	if err := os.WriteFile(c.config, []byte("entries:\n  a: {task: tasks.add, every: 1s, args: [1, 1]}\n  b: {task: tasks.add, every: 1s, args: [2, 2]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "entry b to fire after reload", func() bool {
		for _, m := range c.audit("celery") {
			if m.Entry == "b" {
				return true
			}
		}
		return false
	})
	// A bad file: the running config stays, the error names FILE:LINE:COL
	// and the metric says so. SIGHUP also reloads.
	if err := os.WriteFile(c.config, []byte("entries:\n  a: {task: tasks.add, every: 1s}\n  b: {task: tasks.add, every: nope}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lead.Signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the failed reload to show", func() bool {
		v, ok := lead.Metric("beatd_config_last_reload_successful")
		return ok && v == 0
	})
	logb, _ := os.ReadFile(lead.LogPath)
	if !strings.Contains(string(logb), c.config+":3:31: every") {
		t.Errorf("reload error lacks %q in %s (%d bytes):\n%s", c.config+":3:31: every", lead.LogPath, len(logb), logb)
	}
	fires := func() int { return len(c.firesOf("b")) }
	before := fires()
	waitFor(t, 10*time.Second, "entry b to go on firing after the bad reload", func() bool { return fires() > before+1 })
}

func TestProcessAdmin(t *testing.T) {
	c := newCluster(t, "entries:\n  hourly: {task: tasks.add, cron: '0 * * * *', args: [1, 1]}\n  every: {task: tasks.add, every: 1s, args: [2, 2]}\n", 2)
	c.leader("", 20*time.Second)
	standby := c.replicas[0]
	post := func(r *replica, path, token string) int {
		req, _ := http.NewRequest("POST", r.URL(path), nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(standby, "/entries/hourly/trigger", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", code)
	}
	if code := post(standby, "/entries/hourly/trigger", ""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d", code)
	}
	// Any replica takes the request; the leader acts within a second.
	sent := time.Now()
	if code := post(standby, "/entries/hourly/trigger", "test-token"); code != http.StatusAccepted {
		t.Fatalf("trigger: %d", code)
	}
	waitFor(t, 5*time.Second, "the trigger to publish", func() bool {
		for _, m := range c.audit("celery") {
			if m.Entry == "hourly" {
				return true
			}
		}
		return false
	})
	if took := time.Since(sent); took > time.Second {
		t.Errorf("trigger published after %s", took)
	}

	// The CLI: pause, check nothing fires, resume.
	cli := func(args ...string) string {
		out, err := exec.Command(beatdBin, append(args, "--etcd-endpoints", strings.Join(c.etcd, ","), "--prefix", c.prefix)...).CombinedOutput()
		if err != nil {
			t.Fatalf("beatd %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := cli("pause", "every"); !strings.Contains(out, "done") {
		t.Fatalf("pause: %s", out)
	}
	count := func() int { return len(c.firesOf("every")) }
	paused := count()
	time.Sleep(2500 * time.Millisecond) // proves a negative: an every: 1s entry not paused fires twice in it
	if n := count(); n > paused+1 {     // one publish may have been in flight
		t.Errorf("paused entry fired %d times", n-paused)
	}
	// A pause survives failover.
	lead, _ := c.leader("", time.Second)
	lead.Signal(syscall.SIGTERM)
	c.leader(lead.ID, 5*time.Second)
	time.Sleep(1500 * time.Millisecond) // proves a negative: the new leader would have fired it by now
	if n := count(); n > paused+1 {
		t.Errorf("pause lost across failover: %d fires", n-paused)
	}
	st := cli("status", "--json")
	if !strings.Contains(st, `"paused": true`) {
		t.Errorf("status does not show the pause:\n%s", st)
	}
	if out := cli("resume", "every"); !strings.Contains(out, "done") {
		t.Fatalf("resume: %s", out)
	}
	waitFor(t, 5*time.Second, "the resumed entry to fire", func() bool { return count() > paused+1 })
}

// publishedThrough waits until every entry has a message for a slot at
// or after t, so a window of the test's run really saw publishes (on a
// loaded machine time passing proves nothing), and returns when it did.
func (c *cluster) publishedThrough(t time.Time, timeout time.Duration) time.Time {
	c.t.Helper()
	cfg, err := config.LoadFile(c.config)
	if err != nil {
		c.t.Fatal(err)
	}
	waitFor(c.t, timeout, "publishes through "+t.Format(time.TimeOnly), func() bool {
		last := map[string]time.Time{}
		for _, m := range c.audit("celery", "other") {
			if m.Slot.After(last[m.Entry]) {
				last[m.Entry] = m.Slot
			}
		}
		for _, e := range cfg.Entries {
			if last[e.Name].Before(t) {
				return false
			}
		}
		return true
	})
	return time.Now()
}

// waitFor polls cond, which reads a process or a server, until it holds.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, timeout, 50*time.Millisecond, what, cond)
}
