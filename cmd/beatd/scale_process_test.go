package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/testkit/testutil"
)

// scaleEntries writes n runtime entries of mixed kinds, as tenants have
// them: intervals, crontabs in several zones and one-offs, named
// tenant-NNNNNN; the first `fast` fire every second on queue celery.
func scaleEntries(t *testing.T, path string, n, fast int) {
	t.Helper()
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"}
	var b strings.Builder
	b.WriteString("entries:\n")
	for i := range n {
		name := fmt.Sprintf("tenant-%06d", i)
		switch {
		case i < fast:
			fmt.Fprintf(&b, "  %s: {task: tasks.fast, every: 1s, args: [%d]}\n", name, i)
		case i%10 < 6:
			fmt.Fprintf(&b, "  %s: {task: tasks.sync, every: %ds, args: [%d], options: {queue: sync}}\n", name, 60*(1+i%1440), i)
		case i%10 < 9:
			fmt.Fprintf(&b, "  %s: {task: tasks.report, crontab: {minute: '%d', hour: '*/%d'}, timezone: %s}\n", name, i%60, 1+i%12, zones[i%len(zones)])
		default:
			fmt.Fprintf(&b, "  %s: {task: tasks.remind, at: '2099-0%d-1%dT0%d:00:00Z'}\n", name, 1+i%9, i%10, i%10)
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestProcessScaleSmall is the million-entry paths at 5,000 entries, on
// an etcd that takes at most 40 operations a transaction: the chunked
// apply learns the limit and splits by it, the leader's state writes keep
// within it, the entries API and /status answer in pages (filtered by
// prefix, task and queue), and one change among them applies at once.
func TestProcessScaleSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd processes")
	}
	const (
		n      = 5000
		fast   = 20
		maxOps = 40
	)
	c := &cluster{t: t, redis: testutil.MustStartRedis(t), dir: t.TempDir()}
	c.rdb = c.redis.Client()
	c.config = filepath.Join(c.dir, "schedules.yaml")
	if err := os.WriteFile(c.config, []byte("entries:\n  seed: {task: tasks.add, every: 1h}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newReplica(t, "scale", filepath.Join(c.dir, "scale.log"))
	etcdPort := testutil.FreePort(t)
	r.Args = []string{"run", "--config", c.config, "--data-dir", filepath.Join(c.dir, "data"),
		"--etcd-client-port", strconv.Itoa(etcdPort), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)),
		"--etcd-max-txn-ops", strconv.Itoa(maxOps), "--broker", c.redis.URL(0), "--id", r.ID,
		"--lease-ttl", "2s", "--http", "127.0.0.1:" + strconv.Itoa(r.HTTPPort), "--log-format", "json"}
	c.replicas = append(c.replicas, r)
	r.start()
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(r.LogPath)
			lines := strings.Split(string(b), "\n")
			t.Logf("--- log tail ---\n%s", strings.Join(lines[max(len(lines)-40, 0):], "\n"))
		}
	})
	waitFor(t, 60*time.Second, "leading", func() bool { v, ok := r.Metric("beatd_is_leader"); return ok && v == 1 })

	file := filepath.Join(c.dir, "tenants.yaml")
	scaleEntries(t, file, n, fast)
	start := time.Now()
	code, out, errs := c.apiCLI(r, "admin", "entries", "apply", "-f", file)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("applied %d/%d entries", n, n)) {
		t.Fatalf("apply: exit %d\n%s\n%s", code, lastLines(out, 3), errs)
	}
	t.Logf("applied %d entries in %s at --max-txn-ops %d", n, time.Since(start).Round(time.Millisecond), maxOps)
	get := func(path string, v any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, r.URL(path), nil)
		req.Header.Set("Authorization", "Bearer test-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %s", path, resp.Status, buf.String())
		}
		if err := json.Unmarshal(buf.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	waitFor(t, 30*time.Second, "every entry running", func() bool {
		var st api.Status
		get("/status", &st)
		return st.EntriesTotal == n+1
	})

	// Every entry once, in order, in pages of 700, with next.
	var names []string
	pages := 0
	for after := ""; ; pages++ {
		var p api.Page
		get("/api/v1/entries?limit=700&after="+url.QueryEscape(after), &p)
		if len(p.Entries) > 700 {
			t.Fatalf("a page of %d entries, limit 700", len(p.Entries))
		}
		for _, e := range p.Entries {
			if !e.Active {
				t.Fatalf("%s not running: %s", e.Name, e.Problem)
			}
			names = append(names, e.Name)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	if len(names) != n+1 || !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != n+1 {
		t.Fatalf("pages listed %d names (sorted %v), want %d distinct in order", len(names), slices.IsSorted(names), n+1)
	}
	if pages != (n+1)/700 {
		t.Errorf("%d pages after the first, want %d", pages, (n+1)/700)
	}
	// Filters.
	var p api.Page
	get("/api/v1/entries?prefix=tenant-0012", &p)
	if len(p.Entries) != 100 || p.Next != "" || !strings.HasPrefix(p.Entries[0].Name, "tenant-0012") {
		t.Errorf("prefix tenant-0012: %d entries, next %q", len(p.Entries), p.Next)
	}
	get("/api/v1/entries?task=tasks.remind&limit=5000", &p)
	if len(p.Entries) != (n-fast)/10 {
		t.Errorf("task tasks.remind: %d entries, want %d", len(p.Entries), (n-fast)/10)
	}
	for _, e := range p.Entries {
		if e.Task != "tasks.remind" || len(e.Spec) == 0 {
			t.Fatalf("task filter returned %s (task %s, spec %d bytes)", e.Name, e.Task, len(e.Spec))
		}
	}
	get("/api/v1/entries?queue=sync&limit=10", &p)
	if len(p.Entries) != 10 || p.Next == "" {
		t.Errorf("queue sync, limit 10: %d entries, next %q", len(p.Entries), p.Next)
	}
	if code, out, _ := c.apiCLI(r, "admin", "entries", "list", "--name-prefix", "tenant-004"); code != 0 || strings.Count(out, "tenant-004") != 1000 {
		t.Errorf("entries list --name-prefix tenant-004: exit %d, %d rows", code, strings.Count(out, "tenant-004"))
	}
	// /status is a page by default, with the total and next.
	var st api.Status
	get("/status", &st)
	if len(st.Entries) != api.DefaultStatusLimit || st.EntriesTotal != n+1 || st.Next == "" {
		t.Fatalf("/status: %d entries of %d, next %q", len(st.Entries), st.EntriesTotal, st.Next)
	}
	// The replica's clock against etcd's (its own, embedded: in step).
	if st.ClockOffsetSeconds == nil || *st.ClockOffsetSeconds > st.ClockOffsetUncertaintySeconds+0.1 ||
		*st.ClockOffsetSeconds < -st.ClockOffsetUncertaintySeconds-0.1 || st.ClockWarning != "" {
		t.Errorf("/status clock offset %v ± %v (%q), want ~0 from etcd's Date headers", st.ClockOffsetSeconds, st.ClockOffsetUncertaintySeconds, st.ClockWarning)
	}
	// The CLI's status (from etcd) of one entry far past the first page,
	// and a note that the table is a page.
	one, err := exec.Command(beatdBin, "status", "tenant-004321", "--etcd-endpoints", "http://127.0.0.1:"+strconv.Itoa(etcdPort)).CombinedOutput()
	if err != nil || !strings.Contains(string(one), "tenant-004321") {
		t.Errorf("beatd status tenant-004321: %v\n%s", err, one)
	}
	all, err := exec.Command(beatdBin, "status", "--etcd-endpoints", "http://127.0.0.1:"+strconv.Itoa(etcdPort)).CombinedOutput()
	if err != nil || !strings.Contains(string(all), fmt.Sprintf("showing the first 1000 of %d entries", n+1)) {
		t.Errorf("beatd status of %d entries: %v\n%s", n+1, err, lastLines(string(all), 3))
	}
	var st2 api.Status
	get("/status?limit=10&after="+url.QueryEscape(st.Next), &st2)
	if len(st2.Entries) != 10 || st2.Entries[0].Name <= st.Next {
		t.Fatalf("/status next page: %d entries from %q after %q", len(st2.Entries), st2.Entries[0].Name, st.Next)
	}
	// The leader wrote the state of 5,000 entries within 40 operations a
	// transaction, and fires.
	waitFor(t, 20*time.Second, "the fast entries firing", func() bool { return len(c.firesOf("tenant-000003")) >= 2 })
	if v, ok := r.Metric("beatd_state_persist_failing"); !ok || v != 0 {
		t.Errorf("beatd_state_persist_failing = %v (%v): the state writes break etcd's limit", v, ok)
	}
	// One change among them applies within a second.
	body := `{"task":"tasks.fast","every":"1s","args":[-1],"options":{"queue":"moved"}}`
	req, _ := http.NewRequest(http.MethodPut, r.URL("/api/v1/entries/tenant-000004"), strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer test-token")
	req.Header.Set("Content-Type", "application/json")
	put := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %v %v", resp, err)
	}
	resp.Body.Close()
	waitFor(t, 5*time.Second, "the change to fire", func() bool {
		n, err := c.rdb.LLen(t.Context(), "moved").Result()
		return err == nil && n > 0
	})
	if took := time.Since(put); took > 2*time.Second {
		t.Errorf("a PUT among %d entries first fired %s later; want within the next slot", n, took)
	}
}
