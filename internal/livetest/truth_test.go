package livetest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// What beatd says must be what happened, judged against the broker and
// the worker: these tests read the worker's own results and the metrics,
// not beatd's memory.

// TestFailoverReportsWhatHappened: kill -9 the leader while a run is on
// the worker. The run ends during the leaderless gap, so its
// task-succeeded event comes while no replica leads; the new leader's
// re-publish of the slot is refused as already pushed. No slot the worker
// ran shows "duplicate", and the run shows succeeded soon after the new
// leader is elected.
func TestFailoverReportsWhatHappened(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorkerWith(t, rs, testutil.CeleryOptions{Queues: "celery", Events: true, Pool: "prefork", Concurrency: 4})
	sent := recordTaskEvents(t, rs)
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  gap: {task: tasks.sleep, every: 6s, args: [2, gap]}
  tick: {task: tasks.add, every: 1s, args: [1, 2]}
`)
	args := func(id string) []string {
		return []string{"--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/truth/",
			"--broker", rs.URL(0), "--lease-ttl", "2s", "--state-interval", "1s", "--id", id}
	}
	a := startBeatd(t, nil, args("a")...)
	waitFor(t, 20*time.Second, "a leads", func() bool { return a.status(t).Leader })
	b := startBeatd(t, nil, args("b")...)
	waitFor(t, 20*time.Second, "b stands by", func() bool { code, _ := b.get("/status"); return code == 200 })
	// Kill a right after it publishes a run of gap: the worker ends that
	// run 2 s later, while no replica leads.
	fires := func() []string { return gapFires.FindAllString(a.output(), -1) }
	n := len(fires())
	waitFor(t, 20*time.Second, "a publishes a run of gap", func() bool { return len(fires()) > n })
	a.Kill()
	f := fires()
	taskID := gapTaskID.FindStringSubmatch(f[len(f)-1])[1]
	waitFor(t, 20*time.Second, "b leads", func() bool { return b.status(t).Leader })
	elected := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			e, _ := entryOf(b.status(t), "gap")
			t.Logf("gap's runs on b (looking for %s): %+v", taskID, e.Runs)
			// Whether the worker had ended them tells a late worker from
			// a report beatd lost (a CI run under load once saw neither
			// this run's success nor two later ones within 10 s).
			for _, x := range executions(t, rs, "gap") {
				t.Logf("the worker ran gap %s from %s to %s and published the events %v", x.id,
					time.UnixMilli(int64(x.start*1000)).UTC().Format(time.StampMilli), time.UnixMilli(int64(x.end*1000)).UTC().Format(time.StampMilli),
					sent(x.id))
			}
		}
	})
	// The bound is a margin for a loaded CI machine, not the claim (the
	// time it took is logged below). An entry's state lists its last
	// store.KeptRuns (3) runs, so gap runs every 6 s: the run stays
	// listed ~18 s.
	waitFor(t, 15*time.Second, "the run the worker finished in the gap shows succeeded on b", func() bool {
		e, _ := entryOf(b.status(t), "gap")
		for _, r := range e.Runs {
			if r.TaskID == taskID {
				return r.Outcome == "succeeded"
			}
		}
		return false
	})
	t.Logf("outcome of the gap's run seen %s after b's election", time.Since(elected).Round(time.Millisecond))
	if !slices.Contains(sent(taskID), "task-succeeded") {
		t.Errorf("b shows %s succeeded, but the worker published only %v for it", taskID, sent(taskID))
	}
	// The worker ran it once.
	if n := len(executions(t, rs, "gap")); n == 0 {
		t.Fatal("the worker recorded no run of gap")
	}
	st := b.status(t)
	for _, e := range st.Entries {
		if e.LastResult == "duplicate" {
			t.Errorf("%s: last result duplicate after the failover", e.Name)
		}
	}
	if strings.Contains(b.output(), `"result":"duplicate"`) {
		t.Error(`b's fire log says "result":"duplicate" for a slot published once`)
	}
	_, metrics := b.get("/metrics")
	if v := metricValue(metrics, `beatd_fires_total{entry="tick",result="duplicate"}`); v != 0 {
		t.Errorf(`beatd_fires_total{entry="tick",result="duplicate"} = %v, want 0`, v)
	}
}

// TestOutageCountsSlotsNotRetries: Redis down 20 s under a 1-s entry
// counts about 20 failed slots, not every retry; retries count apart.
func TestOutageCountsSlotsNotRetries(t *testing.T) {
	t.Parallel() // judges what happened, not how fast: see main_test.go
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", "entries:\n  tick: {task: tasks.add, every: 1s, args: [1, 2]}\n")
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/outage/",
		"--broker", rs.URL(0), "--lease-ttl", "5s", "--id", "o")
	p.waitFired(3, 30*time.Second)
	rs.Stop()
	time.Sleep(20 * time.Second) // the outage itself: nothing to poll for
	rs.Start()
	waitFor(t, 30*time.Second, "publishing again", func() bool {
		_, m := p.get("/metrics")
		return metricValue(m, "beatd_pending_slots") == 0 && metricValue(m, `beatd_fires_total{entry="tick",result="ok"}`) > 20
	})
	_, m := p.get("/metrics")
	failed := metricValue(m, `beatd_fires_total{entry="tick",result="error"}`)
	retries := metricValue(m, "beatd_publish_retries_total")
	t.Logf("outage of 20 s: %v failed slots, %v retries", failed, retries)
	if failed < 15 || failed > 22 {
		t.Errorf(`beatd_fires_total{entry="tick",result="error"} = %v after a 20-s outage of a 1-s entry, want 15..22`, failed)
	}
	if retries <= failed {
		t.Errorf("beatd_publish_retries_total = %v, want the retries counted apart (more than the %v slots)", retries, failed)
	}
}

var (
	metricLine = regexp.MustCompile(`^(\S+) (\S+)$`)
	gapFires   = regexp.MustCompile(`"msg":"fired".*"entry":"gap".*`)
	gapTaskID  = regexp.MustCompile(`"task_id":"([^"]+)"`)
)

// metricValue reads one series' value from a /metrics text (0 if absent).
func metricValue(text, series string) float64 {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m != nil && m[1] == series {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return 0
}

// TestSubFloorEntryLeavesTheOthersOnTime: an entry every 1 ms, below the
// 100-ms floor and admitted by --min-interval, through the entries API
// and through the file. The other entries keep their time, and its
// DELETE (a reload of the file without it) stops it within a second,
// judged by what reached its queue in Redis.
func TestSubFloorEntryLeavesTheOthersOnTime(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	dir := t.TempDir()
	const admin = "admin-token-x"
	tokenFile := writeFile(t, dir, "admin-token", admin)
	const base = "entries:\n  other: {task: tasks.add, every: 1s, relative: true, options: {queue: otherq}}\n"
	cfg := writeFile(t, dir, "schedules.yaml", base+"  filefast: {task: tasks.add, every: 1ms, options: {queue: filefastq}}\n")
	p := startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/floor/",
		"--broker", rs.URL(0), "--lease-ttl", "2s", "--id", "f", "--min-interval", "1ms", "--admin-token-file", tokenFile,
		"--log-fires", "1000000") // every fire line, so other's lags can be read
	waitFor(t, 20*time.Second, "p leads", func() bool { return p.status(t).Leader })
	rdb := rs.Client()
	llen := func(q string) int64 { n, _ := rdb.LLen(context.Background(), q).Result(); return n }
	waitFor(t, 10*time.Second, "filefast firing", func() bool { return llen("filefastq") > 500 })

	// Through the API too.
	req, _ := http.NewRequest(http.MethodPut, p.URL("/api/v1/entries/apifast"), strings.NewReader(`{"task": "tasks.add", "every": "1ms", "options": {"queue": "apifastq"}}`))
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT apifast: %v %v", resp, err)
	}
	resp.Body.Close()
	waitFor(t, 10*time.Second, "apifast firing", func() bool { return llen("apifastq") > 500 })

	// The other entry keeps its time while both spin: 4 s, ~4 slots, each
	// published within 250 ms of its due time (the fire log's lag).
	start := llen("otherq")
	time.Sleep(4 * time.Second) // the window being judged
	if got := llen("otherq") - start; got < 3 || got > 5 {
		t.Errorf("other published %d slots in 4 s beside two 1-ms entries, want ~4", got)
	}
	lags := otherLags.FindAllStringSubmatch(p.output(), -1)
	if len(lags) < 4 {
		t.Errorf("found %d fire lines of other, want its lags", len(lags))
	}
	for _, m := range lags {
		if d, err := time.ParseDuration(m[1]); err == nil && d > 250*time.Millisecond {
			t.Errorf("other published %s late beside the 1-ms entries", d)
		}
	}

	// The API's DELETE stops apifast within a second.
	req, _ = http.NewRequest(http.MethodDelete, p.URL("/api/v1/entries/apifast"), nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE apifast: %v %v", resp, err)
	}
	resp.Body.Close()
	assertStopsWithin(t, func() int64 { return llen("apifastq") }, "apifast after its DELETE")

	// The file without filefast, hot-reloaded, stops it within a second.
	writeFile(t, dir, "schedules.yaml", base)
	assertStopsWithin(t, func() int64 { return llen("filefastq") }, "filefast after the file dropped it")
	if code, body := p.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after both deletes = %d %s", code, body)
	}
}

// assertStopsWithin fails unless n stops growing within a second: two
// reads 1 s and 2 s from now are equal.
func assertStopsWithin(t *testing.T, n func() int64, what string) {
	t.Helper()
	time.Sleep(time.Second) // the bound being checked
	a := n()
	time.Sleep(time.Second)
	if b := n(); b != a {
		t.Errorf("%s: %d more messages between 1 s and 2 s after it, want none", what, b-a)
	}
}

var otherLags = regexp.MustCompile(`"msg":"fired".*"entry":"other".*"lag":"([^"]+)"`)

// recordTaskEvents subscribes to the task events the workers publish on
// rs, as a witness apart from beatd: what it returns lists the event
// types published for a task id so far. It reads Kombu's envelope
// itself, so a fault in beatd's parser cannot hide an event.
func recordTaskEvents(t *testing.T, rs *testutil.Redis) (sent func(taskID string) []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ps := rs.Client().PSubscribe(ctx, "/0.celeryev/task.*")
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatalf("subscribe to the task events: %v", err)
	}
	var mu sync.Mutex
	seen := map[string][]string{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ps.Channel() {
			var env struct {
				Body       string `json:"body"`
				Properties struct {
					BodyEncoding string `json:"body_encoding"`
				} `json:"properties"`
			}
			if json.Unmarshal([]byte(m.Payload), &env) != nil {
				continue
			}
			body := []byte(env.Body)
			if env.Properties.BodyEncoding == "base64" {
				var err error
				if body, err = base64.StdEncoding.DecodeString(env.Body); err != nil {
					continue
				}
			}
			type event struct{ Type, UUID string }
			var evs []event
			if json.Unmarshal(body, &evs) != nil {
				var one event
				if json.Unmarshal(body, &one) != nil {
					continue
				}
				evs = []event{one}
			}
			mu.Lock()
			for _, e := range evs {
				seen[e.UUID] = append(seen[e.UUID], e.Type)
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); ps.Close(); <-done })
	return func(id string) []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen[id])
	}
}
