package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// jsonLines fails the test unless every line of log is a JSON object.
func jsonLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Errorf("log line is not JSON: %q", sc.Text())
			continue
		}
		out = append(out, v)
	}
	return out
}

// TestRunEmptyConfigAndMetrics: an empty config is warned about at start;
// /metrics has the build info and the dependency gauges.
func TestRunEmptyConfigAndMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	config := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(config, []byte("entries: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var log testutil.SyncBuffer
	m := newTestMain(&log, &log)
	if err := m.ParseFlags(context.Background(), []string{"--config", config, "--etcd-endpoints", strings.Join(srv.Endpoints, ","),
		"--broker", rs.URL(0), "--http", "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if !strings.Contains(log.String(), `"level":"WARN","msg":"the config has no entries: nothing will be published"`) {
		t.Errorf("no warning for an empty config:\n%s", log.String())
	}
	var body string
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "dependency gauges", func() bool {
		resp, err := http.Get("http://" + m.HTTPAddress() + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return strings.Contains(body, `beatd_dependency_up{dependency="broker"} 1`) && strings.Contains(body, `beatd_dependency_up{dependency="etcd"} 1`)
	})
	for _, want := range []string{`beatd_build_info{goversion="go`, `beatd_pending_slots 0`, `beatd_config_reloads_total{result="error"} 0`, "beatd_per_entry_metrics 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	jsonLines(t, log.String())
}

// TestEmbeddedEtcdLogsAreOurs: the embedded etcd's own lines come out
// through beatd's logger, as JSON with component=etcd. At debug level
// etcd's warnings pass, and it always warns at start (one port serves
// both gRPC and HTTP).
func TestEmbeddedEtcdLogsAreOurs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	rs := testutil.MustStartRedis(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	_ = os.WriteFile(config, []byte("entries:\n  a: {task: t.a, every: 1m}\n"), 0o644)
	var log testutil.SyncBuffer
	m := newTestMain(&log, &log)
	if err := m.ParseFlags(context.Background(), []string{"--config", config, "--data-dir", filepath.Join(dir, "data"), "--broker", rs.URL(0),
		"--etcd-client-port", strconv.Itoa(testutil.FreePort(t)), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)), "--http", "127.0.0.1:0", "--log-level", "debug"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = m.Close()
	etcdLines := 0
	for _, v := range jsonLines(t, log.String()) {
		if v["component"] == "etcd" {
			etcdLines++
		}
	}
	if etcdLines == 0 {
		t.Errorf("no etcd line in the log:\n%s", log.String())
	}
}
