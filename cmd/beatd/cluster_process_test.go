package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
)

// TestProcessCLIFindsTheCluster: with only --etcd-endpoints and --prefix
// (no --server, no --broker), entries, backfill and status reach the
// leader's HTTP at the address it registered in etcd; status reads the
// recent runs through the leader and never dials a broker of its own,
// so it makes no attempt on 127.0.0.1:6379 (Redis's default) when the
// cluster's broker is elsewhere. The console's Source column says "api"
// for an entry created through the API, as /status does.
//
// Not parallel: it listens on 127.0.0.1:6379 while status runs, which
// another test's default broker could reach.
func TestProcessCLIFindsTheCluster(t *testing.T) {
	c := newCluster(t, "entries:\n  filed: {task: tasks.add, every: 1s}\n", 2)
	lead, _ := c.leader("", 20*time.Second)
	waitFor(t, 10*time.Second, "filed to fire", func() bool { return len(c.firesOf("filed")) > 1 })

	// The CLI's environment: the admin token and nothing else of beatd's
	// (a BEATD_SERVER or BEATD_BROKER of the test's would hide the point).
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BEATD_") {
			env = append(env, kv)
		}
	}
	env = append(env, "BEATD_ADMIN_TOKEN=test-token")
	cli := func(args ...string) (int, string, string, time.Duration) {
		t.Helper()
		cmd := exec.Command(beatdBin, append(args, "--etcd-endpoints", strings.Join(c.etcd, ","), "--prefix", c.prefix)...)
		cmd.Env = env
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		code := 0
		if err != nil {
			ee, ok := err.(*exec.ExitError)
			if !ok {
				t.Fatalf("beatd %v: %v", args, err)
			}
			code = ee.ExitCode()
		}
		return code, out.String(), errb.String(), took
	}

	file := filepath.Join(c.dir, "dyn.yaml")
	if err := os.WriteFile(file, []byte("entries:\n  dyn: {task: tasks.add, every: 1s, args: [7, 7]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errs, _ := cli("entries", "apply", "-f", file); code != 0 || !strings.Contains(out, "entry dyn applied") {
		t.Fatalf("entries apply with only etcd flags: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs, _ := cli("entries", "list")
	if code != 0 || !regexp.MustCompile(`(?m)^dyn +api `).MatchString(out) || !regexp.MustCompile(`(?m)^filed +file `).MatchString(out) {
		t.Errorf("entries list with only etcd flags: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs, _ := cli("entries", "get", "dyn", "-o", "yaml"); code != 0 || !strings.Contains(out, "source: api") {
		t.Errorf("entries get with only etcd flags: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs, _ := cli("backfill", "filed", "--from=-5s", "--to=now", "--dry-run"); code != 0 {
		t.Errorf("backfill --dry-run with only etcd flags: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs, _ := cli("backfill", "--list"); code != 0 {
		t.Errorf("backfill --list with only etcd flags: exit %d\n%s%s", code, out, errs)
	}
	waitFor(t, 10*time.Second, "dyn to fire", func() bool { return len(c.firesOf("dyn")) > 0 })

	// status: Redis's default port, when free, must see no connection.
	var dialed atomic.Int32
	if ln, err := net.Listen("tcp", "127.0.0.1:6379"); err == nil {
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				dialed.Add(1)
				conn.Close()
			}
		}()
		defer ln.Close()
	} else {
		t.Logf("127.0.0.1:6379 is taken (%v): checking status's output and time only", err)
	}
	var st api.Status
	var took time.Duration
	waitFor(t, 10*time.Second, "status to show the runs, through the leader", func() bool {
		var code int
		code, out, errs, took = cli("status", "-o", "json")
		if code != 0 {
			t.Fatalf("status with only etcd flags: exit %d\n%s", code, errs)
		}
		st = api.Status{}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		for _, e := range st.Entries {
			if e.Name == "dyn" && len(e.RecentRuns) > 0 && e.TotalRunCount > 0 && e.LastRunAt != nil {
				return true
			}
		}
		return false
	})
	if strings.Contains(errs, "WARN") || strings.Contains(strings.ToLower(errs), "redis") || strings.Contains(errs, "6379") {
		t.Errorf("status says something of a broker of its own:\n%s", errs)
	}
	if n := dialed.Load(); n > 0 {
		t.Errorf("status made %d connections to 127.0.0.1:6379", n)
	}
	if took > 3*time.Second {
		t.Errorf("status took %s", took)
	}
	byName := map[string]api.EntryStatus{}
	for _, e := range st.Entries {
		byName[e.Name] = e
	}
	if f := byName["filed"]; f.Source != "file" || len(f.RecentRuns) == 0 || f.LastResult == "" {
		t.Errorf("filed in status: source %q, %d recent runs, last result %q", f.Source, len(f.RecentRuns), f.LastResult)
	}
	if byName["dyn"].Source != "api" {
		t.Errorf("dyn in status: source %q, want api", byName["dyn"].Source)
	}
	code, out, errs, _ = cli("status")
	if code != 0 || !strings.Contains(out, "dyn") || strings.Contains(errs, "unavailable") {
		t.Errorf("status table: exit %d\n%s%s", code, out, errs)
	}
	if n := dialed.Load(); n > 0 {
		t.Errorf("status made %d connections to 127.0.0.1:6379", n)
	}

	// The console, on the standby too, says what status says.
	for _, r := range c.replicas {
		req, _ := http.NewRequest(http.MethodGet, r.URL("/"), nil)
		req.Header.Set("Authorization", "Bearer test-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		row := regexp.MustCompile(`(?s)<tr data-entry="dyn">.*?</tr>`).FindString(string(page))
		if resp.StatusCode != http.StatusOK || !strings.Contains(row, `<td data-label="Source">api</td>`) {
			t.Errorf("console of %s (leader %v): %d, dyn's row: %s", r.ID, r == lead, resp.StatusCode, row)
		}
	}

	// A prefix no cluster runs under: the error says so, and what to do.
	cmd := exec.Command(beatdBin, "entries", "list", "--etcd-endpoints", strings.Join(c.etcd, ","), "--prefix", "/nobody/")
	cmd.Env = env
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "no beatd leads the cluster under prefix /nobody/") || !strings.Contains(string(b), "--server") {
		t.Errorf("entries list under an empty prefix: %v\n%s", err, b)
	}
}
