package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/testkit/testutil"
	"gopkg.in/yaml.v3"
)

// cli runs the beatd binary against the cluster and returns its exit
// code, stdout and stderr.
func (c *cluster) cli(args ...string) (int, string, string) {
	c.t.Helper()
	cmd := exec.Command(beatdBin, append(args, "--etcd-endpoints", strings.Join(c.etcd, ","), "--prefix", c.prefix)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			c.t.Fatalf("beatd %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return code, out.String(), errb.String()
}

// TestProcessOperatorCLI: trigger of an unknown entry fails; status works
// without --config, from the config the leader published, and shows each
// entry's last result; its output formats parse.
func TestProcessOperatorCLI(t *testing.T) {
	// Its own servers and no timing bound: it runs beside the waiting tests.
	t.Parallel()
	c := newCluster(t, "entries:\n  hourly: {task: tasks.add, cron: '0 * * * *', args: [1, 1]}\n  every: {task: tasks.add, every: 1s, args: [2, 2]}\n", 2)
	c.leader("", 20*time.Second)
	// The leader publishes its config right after it is elected.
	waitFor(t, 10*time.Second, "the leader's config in etcd", func() bool {
		code, _, _ := c.cli("trigger", "hourly", "--wait", "0")
		return code == 0
	})
	// Shell completion offers the leader's entry names.
	// (cobra completes the last word: the flags go before it.)
	comp, err := exec.Command(beatdBin, "__complete", "trigger", "--etcd-endpoints", strings.Join(c.etcd, ","), "--prefix", c.prefix, "").Output()
	if err != nil || !strings.Contains(string(comp), "hourly\n") || !strings.Contains(string(comp), "every\n") {
		t.Errorf("completion of trigger: %v\n%s", err, comp)
	}
	code, out, errs := c.cli("trigger", "no-such-entry")
	if code != 1 || !strings.Contains(errs, `"no-such-entry" is not in the leader's config`) {
		t.Errorf("trigger of an unknown entry: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	for _, op := range []string{"pause", "resume"} {
		if code, _, errs := c.cli(op, "nope"); code != 1 || !strings.Contains(errs, "not in the leader's config") {
			t.Errorf("%s of an unknown entry: exit %d, %s", op, code, errs)
		}
	}
	if code, out, errs := c.cli("trigger", "hourly"); code != 0 || !strings.Contains(out, "trigger hourly: done") {
		t.Fatalf("trigger hourly: exit %d, %s %s", code, out, errs)
	}

	var st api.Status
	waitFor(t, 10*time.Second, "status with last results", func() bool {
		code, out, errs := c.cli("status", "-o", "json")
		if code != 0 {
			t.Fatalf("status -o json: exit %d: %s", code, errs)
		}
		st = api.Status{}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		byName := map[string]api.EntryStatus{}
		for _, e := range st.Entries {
			byName[e.Name] = e
		}
		return byName["every"].LastResult == "ok" && byName["hourly"].LastResult == "manual"
	})
	for _, e := range st.Entries {
		if e.NextRunAt == nil || e.Task != "tasks.add" || e.Schedule == "" {
			t.Errorf("status without --config lacks the schedule or next run of %s: %+v", e.Name, e)
		}
		if e.LastPublishedAt == nil {
			t.Errorf("%s: no last publish", e.Name)
		}
	}
	code, out, _ = c.cli("status")
	if code != 0 || !strings.Contains(out, "RESULT") || !strings.Contains(out, "LAST ERROR") || strings.Contains(out, "NEXT\n") {
		t.Errorf("status table: exit %d\n%s", code, out)
	}
	for _, line := range strings.Split(out, "\n") {
		// ENTRY PAUSED LAST-RUN RESULT OUTCOME NEXT LAST-ERROR; no worker
		// reports outcomes here, so OUTCOME is "-".
		if f := strings.Fields(line); len(f) > 0 && f[0] == "every" && (len(f) != 7 || f[3] != "ok" || f[4] != "-" || f[5] == "-") {
			t.Errorf("status row of every lacks its result or next run: %q", line)
		}
	}
	code, out, _ = c.cli("status", "-o", "yaml")
	var y map[string]any
	if err := yaml.Unmarshal([]byte(out), &y); code != 0 || err != nil || y["leader_id"] == "" {
		t.Errorf("status -o yaml: exit %d, %v\n%s", code, err, out)
	}
	code, out, _ = c.cli("status", "-o", "wide")
	if code != 0 || !strings.Contains(out, "SCHEDULE") || !strings.Contains(out, "cron(0 * * * *)") {
		t.Errorf("status -o wide: exit %d\n%s", code, out)
	}
}

// TestProcessUnresponsiveLeader: a leader that stops renewing its lease
// shows as not responding while its key still exists.
func TestProcessUnresponsiveLeader(t *testing.T) {
	// Its own etcd and Redis, and mostly waits on the lease.
	t.Parallel()
	// The leader renews every ttl/3 and shows as not responding once its
	// lease has under 2/3 of ttl - 1s left, so a stopped leader is flagged
	// from at most ttl/3 + 1s after the stop until it expires, at least
	// 2/3 of ttl after it. With 9s that window was 2s at the worst phase,
	// and one status call that asks the stopped leader's HTTP (as it does
	// until the flag shows) takes 2s: the flag was missed under load. 18s
	// leaves 5s.
	const ttl = 18 * time.Second
	c := newCluster(t, "entries:\n  a: {task: tasks.add, every: 1s}\n", 1, "--lease-ttl", ttl.String())
	lead, l := c.leader("", 20*time.Second)
	// A live leader is never flagged, whenever status looks.
	for i := 0; i < 4; i++ {
		code, out, _ := c.cli("status", "-o", "json")
		var st api.Status
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.LeaderUnresponsive || st.LeaderID != lead.ID {
			t.Fatalf("live leader: exit %d %+v", code, st)
		}
		time.Sleep(ttl / 3 / 4) // spreads the looks across a keepalive interval
	}
	lead.Signal(syscall.SIGSTOP)
	defer lead.Signal(syscall.SIGCONT)
	stopped := time.Now()
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("the last status, %s after the stop:\n%s", time.Since(stopped).Round(100*time.Millisecond), last)
		}
	}()
	waitFor(t, ttl, "the stopped leader to show as not responding", func() bool {
		code, out, errs := c.cli("status")
		last = fmt.Sprintf("exit %d\n%s%s", code, out, errs)
		return strings.Contains(out, "leader: "+lead.ID) && strings.Contains(out, "NOT RESPONDING")
	})
	t.Logf("stopped leader flagged after %s (lease TTL %s, token %d)", time.Since(stopped).Round(100*time.Millisecond), ttl, l.Token)
}

// TestProcessBrokerOutageLogs runs a replica whose Redis fails: every
// line it writes is JSON (go-redis's too, through slog), the outage is
// logged, slots pend, and the recovery is logged.
func TestProcessBrokerOutageLogs(t *testing.T) {
	// Its own etcd and Redis; it judges the log, and times nothing on the
	// wall clock (the etcd half, which times /status, is serial).
	t.Parallel()
	c := newCluster(t, "entries:\n  a: {task: tasks.add, every: 1s}\n", 0)
	r := c.addReplica("r0", "--log-level", "debug")
	c.leader("", 20*time.Second)
	waitFor(t, 10*time.Second, "a fire", func() bool { return len(c.audit("celery")) > 0 })

	// The broker goes down: go-redis logs through slog, beatd logs the
	// outage, slots pend.
	c.redis.Stop()
	waitFor(t, 15*time.Second, "the broker outage in the log", func() bool { return logHas(r, `"msg":"broker unreachable"`) })
	waitFor(t, 10*time.Second, "pending slots", func() bool { v, ok := r.Metric("beatd_pending_slots"); return ok && v > 0 })
	c.redis.Start()
	waitFor(t, 15*time.Second, "the broker back in the log", func() bool { return logHas(r, `"msg":"broker reachable again"`) })

	r.Signal(syscall.SIGTERM)
	<-r.Done()
	checkJSONLog(t, r)
}

// TestProcessDegradedLogs runs a replica whose etcd fails: every line it
// writes is JSON, the outage is logged at once and the recovery too, and
// /status answers within a second, flagged stale. (The broker's outage is
// TestProcessBrokerOutageLogs, which runs in parallel: this one times
// /status, so runs alone.)
func TestProcessDegradedLogs(t *testing.T) {
	c := newCluster(t, "entries:\n  a: {task: tasks.add, every: 1s}\n", 0)
	etcdProxy := testutil.MustStartProxy(t, strings.TrimPrefix(c.etcd[0], "http://"))
	r := c.addReplica("r0", "--etcd-endpoints", "http://"+etcdProxy.Addr(), "--log-level", "debug")
	c.leader("", 20*time.Second)
	waitFor(t, 10*time.Second, "a fire", func() bool { return len(c.audit("celery")) > 0 })

	// etcd is cut off: the outage is logged, /status answers fast from
	// what the replica knew.
	if _, err := getStatus(r, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	etcdProxy.Blackhole(true)
	waitFor(t, 15*time.Second, "the etcd outage in the log", func() bool { return logHas(r, `"msg":"etcd unreachable"`) })
	start := time.Now()
	st, err := getStatus(r, 3*time.Second)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("/status with etcd down: %v", err)
	}
	if !st.Stale || st.StaleSeconds <= 0 || len(st.Entries) != 1 {
		t.Errorf("/status with etcd down is not flagged stale with its age: %+v", st)
	}
	if took > time.Second {
		t.Errorf("/status took %s with etcd down, want under 1s", took)
	}
	etcdProxy.Blackhole(false)
	// The black hole dropped frames mid-stream; a healed network has none
	// missing, so the proxy drops the damaged connections. beatd bounds
	// gRPC's redials (2 s apart; gRPC's default grows to 120 s) and probes
	// every 5 s, so etcd is seen back well within 15 s.
	etcdProxy.Reset()
	back := time.Now()
	waitFor(t, 15*time.Second, "etcd back in the log", func() bool { return logHas(r, `"msg":"etcd reachable again"`) })
	t.Logf("etcd seen back %s after the cut ended", time.Since(back).Round(100*time.Millisecond))

	r.Signal(syscall.SIGTERM)
	<-r.Done()
	checkJSONLog(t, r)
}

// checkJSONLog checks every line of r's log is JSON with a time, a level
// and a message.
func checkJSONLog(t *testing.T, r *replica) {
	t.Helper()
	f, err := os.Open(r.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n, redisLines := 0, 0
	for sc.Scan() {
		n++
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Errorf("log line %d is not JSON: %q", n, sc.Text())
			continue
		}
		if v["level"] == nil || v["msg"] == nil || v["time"] == nil {
			t.Errorf("log line %d lacks time, level or msg: %q", n, sc.Text())
		}
		if v["component"] == "redis" {
			redisLines++
		}
	}
	t.Logf("%d log lines, all JSON; %d from go-redis", n, redisLines)
}

// addReplica starts one more replica and waits until it serves HTTP;
// extra flags override the defaults.
func (c *cluster) addReplica(id string, extra ...string) *replica {
	c.t.Helper()
	r := c.startReplica(id, extra...)
	r.waitHealthy()
	return r
}

func logHas(r *replica, s string) bool {
	b, _ := os.ReadFile(r.LogPath)
	return strings.Contains(string(b), s)
}

func getStatus(r *replica, timeout time.Duration) (api.Status, error) {
	var st api.Status
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL("/status"), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return st, json.Unmarshal(b, &st)
}
