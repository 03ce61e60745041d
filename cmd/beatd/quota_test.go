package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestProcessEtcdQuotaFull fills the embedded etcd's backend quota while
// beatd leads. etcd then refuses every write (the NOSPACE alarm) while
// the lease still holds: beatd must keep publishing every slot exactly
// once, report it in /readyz and the metrics, and catch the state up once
// an operator frees space (compact, defragment, disarm).
func TestProcessEtcdQuotaFull(t *testing.T) {
	// Its own embedded etcd and Redis; it judges the metrics, /readyz,
	// the state and the audit, and times nothing on the wall clock.
	t.Parallel()
	if testing.Short() {
		t.Skip("runs beatd processes")
	}
	rs := testutil.MustStartRedis(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(config, []byte(failoverConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	clientPort := testutil.FreePort(t)
	r := newReplica(t, "quota", filepath.Join(dir, "quota.log"))
	r.Args = []string{"run", "--config", config, "--data-dir", filepath.Join(dir, "data"),
		"--etcd-client-port", strconv.Itoa(clientPort), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)),
		"--etcd-quota-backend-bytes", strconv.Itoa(4 << 20), "--broker", rs.URL(0), "--id", r.ID,
		"--lease-ttl", "2s", "--http", "127.0.0.1:" + strconv.Itoa(r.HTTPPort), "--log-format", "json"}
	r.start()
	t.Cleanup(func() {
		r.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(r.LogPath)
			lines := strings.Split(string(b), "\n")
			t.Logf("--- log tail ---\n%s", strings.Join(lines[max(len(lines)-40, 0):], "\n"))
		}
	})
	waitFor(t, 60*time.Second, "leading", func() bool { v, ok := r.Metric("beatd_is_leader"); return ok && v == 1 })
	start := time.Now()
	endpoint := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	cli := testutil.NewEtcdClient(t, endpoint)
	ctx := context.Background()

	// Fill the quota with someone else's data until etcd raises NOSPACE.
	filler := strings.Repeat("x", 256<<10)
	for i := 0; ; i++ {
		_, err := cli.Put(ctx, "/filler/"+strconv.Itoa(i), filler)
		if errors.Is(err, rpctypes.ErrNoSpace) || (err != nil && strings.Contains(err.Error(), "database space exceeded")) {
			break
		}
		if err != nil {
			t.Fatalf("filling etcd: %v", err)
		}
		if i > 1000 {
			t.Fatal("etcd never ran out of space")
		}
	}
	full := time.Now()
	waitFor(t, 15*time.Second, "beatd_state_persist_failing 1", func() bool {
		v, ok := r.Metric("beatd_state_persist_failing")
		return ok && v == 1
	})
	waitFor(t, 5*time.Second, "/readyz 503", func() bool { return httpStatus(r.URL("/readyz")) == http.StatusServiceUnavailable })
	// Keep it full for a few slots: firing goes on.
	time.Sleep(3 * time.Second) // the scenario: three seconds of a full etcd
	if v, _ := r.Metric("beatd_state_unpersisted_age_seconds"); v < 1 {
		t.Errorf("beatd_state_unpersisted_age_seconds = %v while etcd was full for 3s", v)
	}
	if v, _ := r.Metric("beatd_is_leader"); v != 1 {
		t.Fatal("the leader lost its lease while etcd was full")
	}

	// The operator's fix: drop the filler, compact, defragment, disarm.
	if _, err := cli.Delete(ctx, "/filler/", clientv3.WithPrefix()); err != nil {
		t.Fatalf("delete filler: %v", err)
	}
	resp, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	if _, err := cli.Defragment(ctx, endpoint); err != nil {
		t.Fatalf("defragment: %v", err)
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatalf("disarm: %v", err)
	}
	recovered := time.Now()
	waitFor(t, 15*time.Second, "beatd_state_persist_failing 0", func() bool {
		v, ok := r.Metric("beatd_state_persist_failing")
		return ok && v == 0
	})
	waitFor(t, 5*time.Second, "/readyz 200", func() bool { return httpStatus(r.URL("/readyz")) == http.StatusOK })
	tab, err := store.New(cli, "/beatd/default/").Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := tab.Get("a"); !ok || st.LastSlot.Before(recovered.Add(-time.Second)) {
		t.Errorf("state of a after recovery: %+v, want a slot from after %s", st, recovered.Format(time.RFC3339Nano))
	}
	time.Sleep(time.Second) // the scenario: a second of normal running before the stop
	r.Signal(syscall.SIGTERM)
	<-r.Done()

	b, _ := os.ReadFile(r.LogPath)
	if !strings.Contains(string(b), "etcd refuses state writes") {
		t.Error("no ERROR line about the refused state writes")
	}
	c := &cluster{t: t, rdb: rs.Client(), config: config}
	msgs := c.audit("celery", "other")
	c.checkExactlyOnce(msgs, start.Add(time.Second), time.Now().Add(-2*time.Second))
	t.Logf("etcd full for %s: %d messages, every slot exactly once", recovered.Sub(full).Round(time.Millisecond), len(msgs))
}

func httpStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
