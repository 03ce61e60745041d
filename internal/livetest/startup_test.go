package livetest

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestRunRejectsABadConfigBeforeStarting: `beatd run` checks its config
// file as `beatd validate` does, before it starts the embedded etcd or any
// listener, prints the same FILE:LINE:COL lines and exits 1.
func TestRunRejectsABadConfigBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, config string
		want         []string
	}{
		{name: "parse errors", config: "entries:\n  a: {task: t, every: nope}\n  b: {every: 1s}\n",
			want: []string{":2:23: every: \"nope\" is not a duration", ":3:3: entry \"b\": missing key task"}},
		{name: "unreadable", config: "", want: []string{"read config"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			config := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if tc.config != "" {
				if err := os.WriteFile(config, []byte(tc.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			data := filepath.Join(dir, "data-"+strings.ReplaceAll(tc.name, " ", "-"))
			out := failsAtStart(t, nil, "--config", config, "--data-dir", data,
				"--etcd-client-port", strconv.Itoa(testutil.FreePort(t)), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)))
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			// Each problem on a line of its own, as validate prints them.
			if tc.name == "parse errors" {
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					if !strings.HasPrefix(l, config+":") {
						t.Errorf("line %q is not FILE:LINE:COL: message", l)
					}
				}
			}
			for _, bad := range []string{`"msg"`, "server has been stopped", "embedded"} {
				if strings.Contains(out, bad) {
					t.Errorf("output has %q: something started before the config was checked:\n%s", bad, out)
				}
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				t.Errorf("the data dir was made (%v): etcd started before the config was checked", err)
			}
		})
	}
}

// TestUnreachableEtcdIsNamedAndWaitedFor: with --etcd-endpoints on a
// closed port beatd logs an ERROR naming the endpoint and its dial error
// within 3 s, serves /healthz 200 and /readyz 503 naming the endpoint
// while it waits, and becomes ready once an etcd listens there.
func TestUnreachableEtcdIsNamedAndWaitedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd and an etcd")
	}
	rs := testutil.MustStartRedis(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(config, []byte("entries:\n  tick: {task: tasks.add, every: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t)
	endpoint := "http://127.0.0.1:" + strconv.Itoa(port)
	start := time.Now()
	metrics := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	p := startBeatd(t, nil, "--id", "late", "--config", config, "--broker", rs.URL(0), "--etcd-endpoints", endpoint,
		"--metrics-http", strings.TrimPrefix(metrics, "http://"))
	probe := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testutil.EventuallyEvery(t, 3*time.Second, 50*time.Millisecond, "an ERROR naming the endpoint", func() bool {
		for _, l := range strings.Split(p.output(), "\n") {
			if strings.Contains(l, `"level":"ERROR"`) && strings.Contains(l, `"msg":"etcd unreachable"`) &&
				strings.Contains(l, endpoint+": dial tcp") && strings.Contains(l, "connection refused") {
				return true
			}
		}
		return false
	})
	t.Logf("ERROR naming the endpoint after %v", time.Since(start).Round(time.Millisecond))
	if code, _ := p.get("/healthz"); code != 200 {
		t.Errorf("/healthz while waiting for etcd: %d, want 200", code)
	}
	if code, body := p.get("/readyz"); code != 503 || !strings.Contains(body, endpoint) {
		t.Errorf("/readyz while waiting for etcd: %d %q, want 503 naming %s", code, body, endpoint)
	}
	if code, _ := probe(metrics + "/healthz"); code != 200 {
		t.Errorf("--metrics-http /healthz while waiting for etcd: %d, want 200", code)
	}
	if code, body := probe(metrics + "/readyz"); code != 503 || !strings.Contains(body, endpoint) {
		t.Errorf("--metrics-http /readyz while waiting for etcd: %d %q, want 503 naming %s", code, body, endpoint)
	}
	srv, err := embedetcd.Start(embedetcd.Config{Dir: t.TempDir(), ClientPort: port, PeerPort: testutil.FreePort(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	// Cleanups run last first: stop beatd while this etcd still runs, or
	// its graceful stop waits out its etcd timeouts (10 s) for nothing.
	t.Cleanup(p.stop)
	up := time.Now()
	testutil.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "ready once etcd is up", func() bool {
		code, _ := p.get("/readyz")
		return code == 200
	})
	t.Logf("ready %v after etcd started", time.Since(up).Round(time.Millisecond))
	if code, body := probe(metrics + "/readyz"); code != 200 {
		t.Errorf("--metrics-http /readyz once started: %d %q, want 200", code, body)
	}
	out := p.output()
	for _, want := range []string{`"msg":"etcd reachable again"`, `"msg":"beatd started"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, tail(out, 20))
		}
	}
}

// TestSIGTERMWhileWaitingForEtcd: a replica stopped while it waits for
// etcd exits 0 at once: a stop, not a failed start.
func TestSIGTERMWhileWaitingForEtcd(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(config, []byte("entries: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	endpoint := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	p := startBeatd(t, nil, "--config", config, "--etcd-endpoints", endpoint)
	testutil.EventuallyEvery(t, 3*time.Second, 50*time.Millisecond, "the etcd unreachable ERROR", func() bool {
		return strings.Contains(p.output(), `"msg":"etcd unreachable"`)
	})
	start := time.Now()
	p.Signal(syscall.SIGTERM)
	if !p.Wait(5 * time.Second) {
		t.Fatalf("no exit 5 s after SIGTERM:\n%s", tail(p.output(), 20))
	}
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	if p.ExitCode() != 0 || strings.Contains(p.output(), "failed to start") {
		t.Errorf("exit %d, want 0 and no 'failed to start':\n%s", p.ExitCode(), tail(p.output(), 20))
	}
}
