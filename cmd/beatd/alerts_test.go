package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// alertsFile is the shipped rules file.
const alertsFile = "../../deploy/prometheus/alerts.yaml"

// TestAlertRules runs the rules' unit tests: each alert fires when it
// should, after its `for`, and stays quiet on a healthy cluster.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not installed (Debian package prometheus, which .ci/run installs): a skipped check is not a checked one")
	}
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", "../../deploy/prometheus/alerts_test.yaml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestAlertsLive evaluates the shipped rules with a real Prometheus that
// scrapes a real replica: an overdue entry and failing publishes while
// the broker refuses writes, then no leader once etcd is cut off. It
// checks each alert becomes active (pending or firing: the `for` delays
// are TestAlertRules' business).
func TestAlertsLive(t *testing.T) {
	// Its own servers and Prometheus, mostly waiting on scrapes.
	t.Parallel()
	if testing.Short() {
		t.Skip("runs beatd and prometheus")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed (Debian package prometheus, which .ci/run installs)")
	}
	c := newCluster(t, "entries:\n  hourly: {task: tasks.add, cron: '0 * * * *'}\n", 0)
	etcdProxy := testutil.MustStartProxy(t, strings.TrimPrefix(c.etcd[0], "http://"))
	r := c.addReplica("r0", "--etcd-endpoints", "http://"+etcdProxy.Addr())
	c.leader("", 20*time.Second)

	rules, _ := filepath.Abs(alertsFile)
	dir := t.TempDir()
	promPort := testutil.FreePort(t)
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: beatd
    static_configs: [{targets: ['127.0.0.1:%d']}]
`, rules, r.HTTPPort)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, _ := os.Create(filepath.Join(dir, "prometheus.log"))
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(promPort), "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	active := func() map[string]string {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(promPort) + "/api/v1/alerts")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var v struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string
					State  string
				}
			}
		}
		if json.NewDecoder(resp.Body).Decode(&v) != nil {
			return nil
		}
		out := map[string]string{}
		for _, a := range v.Data.Alerts {
			out[a.Labels["alertname"]] = a.State
		}
		return out
	}
	query := func(q string) string {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(promPort) + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		var v struct {
			Data struct {
				Result []struct{ Value []any }
			}
		}
		if json.NewDecoder(resp.Body).Decode(&v) != nil || len(v.Data.Result) == 0 || len(v.Data.Result[0].Value) < 2 {
			return ""
		}
		s, _ := v.Data.Result[0].Value[1].(string)
		return s
	}
	// Before its first scrape, Prometheus rightly sees no leader: wait
	// for a scrape, then for the rule to see it.
	waitFor(t, 30*time.Second, "prometheus to scrape the leader", func() bool { return query("sum(beatd_is_leader)") == "1" })
	waitFor(t, 10*time.Second, "BeatdNoLeader to clear", func() bool {
		a := active()
		return a != nil && a["BeatdNoLeader"] == ""
	})
	time.Sleep(3 * time.Second) // a few more scrapes of the healthy replica
	if a := active(); a["BeatdNoLeader"] != "" || a["BeatdEntryOverdue"] != "" || a["BeatdFiresFailing"] != "" {
		t.Fatalf("alerts active on a healthy cluster: %v", a)
	}

	// The broker refuses writes (the fence is already raised); an entry
	// added with start_at ten minutes ago owes its backfill, which cannot
	// be published: it is overdue at once.
	rdb := c.redis.Client()
	defer rdb.Close()
	if err := rdb.ConfigSet(context.Background(), "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Minute).Format(time.RFC3339)
	if err := os.WriteFile(c.config, []byte("entries:\n  hourly: {task: tasks.add, cron: '0 * * * *'}\n  late: {task: tasks.add, every: 1m, start_at: '"+start+"', catchup: all}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "BeatdEntryOverdue and BeatdFiresFailing", func() bool {
		a := active()
		return a["BeatdEntryOverdue"] != "" && a["BeatdFiresFailing"] != ""
	})
	if v, ok := r.Metric("beatd_pending_slots"); !ok || v < 5 {
		t.Errorf("beatd_pending_slots = %v, want the backfill pending", v)
	}
	if a := active(); a["BeatdNoLeader"] != "" {
		t.Errorf("BeatdNoLeader active while r0 leads: %v", a)
	}

	// etcd is cut off: the leader's term ends and nobody leads.
	etcdProxy.Blackhole(true)
	waitFor(t, 30*time.Second, "BeatdNoLeader", func() bool { return active()["BeatdNoLeader"] != "" })
	t.Logf("alerts active: %v", active())
}
