package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestParkFlag: --park is wired like every run flag (BEATD_PARK when the
// flag is not given), and is refused where there is no embedded member
// to keep (--etcd-endpoints, as flag or environment), before anything
// starts.
func TestParkFlag(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		park bool
		err  string
	}{
		{name: "off by default"},
		{name: "flag", args: []string{"--park"}, park: true},
		{name: "environment", env: map[string]string{"BEATD_PARK": "true"}, park: true},
		{name: "flag over environment", args: []string{"--park=false"}, env: map[string]string{"BEATD_PARK": "true"}},
		{name: "not a bool", env: map[string]string{"BEATD_PARK": "maybe"}, err: "BEATD_PARK"},
		{name: "with --etcd-endpoints", args: []string{"--park", "--etcd-endpoints", "http://127.0.0.1:2379"},
			err: "--park keeps this replica's embedded etcd member running while the cluster is stopped for a resize; with --etcd-endpoints it has no member to keep"},
		{name: "with BEATD_ETCD_ENDPOINTS", env: map[string]string{"BEATD_PARK": "1", "BEATD_ETCD_ENDPOINTS": "http://127.0.0.1:2379"},
			err: "with --etcd-endpoints it has no member to keep"},
		{name: "with --shards", args: []string{"--park", "--shards", "8"}, park: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := parsedFlags(t, tt.args, tt.env, tt.err)
			if m == nil {
				return
			}
			if m.Park != tt.park {
				t.Errorf("Park = %v, want %v", m.Park, tt.park)
			}
		})
	}
}

// TestParkedSingleMember runs a single embedded replica, beatd's default,
// through a resize in-process (under -race): at --shards 2 it fires;
// restarted parked it runs its etcd member only, answering /readyz and a
// /status that says so, refusing control requests, and publishing
// nothing; a resize killed after staging leaves the cluster mid-resize,
// where a parked start still succeeds (and shows the resize) and an
// unparked one is refused; the resize finished on the parked member,
// the replica restarted at --shards 4 fires again.
func TestParkedSingleMember(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with an embedded etcd, five times")
	}
	rs := testutil.MustStartRedis(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(config, []byte("entries:\n  a: {task: t.a, every: 1s, options: {queue: pq}}\n  b: {task: t.b, every: 1s, options: {queue: pq}}\n  c: {task: t.c, every: 1s, options: {queue: pq}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clientPort := testutil.FreePort(t)
	endpoint := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	args := func(extra ...string) []string {
		return append([]string{"--config", config, "--data-dir", filepath.Join(dir, "data"), "--broker", rs.URL(0),
			"--etcd-client-port", strconv.Itoa(clientPort), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)),
			"--http", "127.0.0.1:0", "--lease-ttl", "2s", "--state-interval", "1s"}, extra...)
	}
	queued := func() int64 { return rs.Client().LLen(context.Background(), "pq").Val() }
	get := func(m *Main, method, path string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+m.HTTPAddress()+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	parkedStatus := func(m *Main) status.Parked {
		code, body := get(m, http.MethodGet, "/status")
		var st api.Status
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.Parked == nil || len(st.Entries) != 0 {
			t.Fatalf("a parked replica's /status: %d %s", code, body)
		}
		return *st.Parked
	}

	m := runMain(t, args("--shards", "2")...)
	testutil.Eventually(t, 20*time.Second, "fires at 2 shards", func() bool { return queued() >= 6 })
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	logs := &testutil.SyncBuffer{}
	parked := func() *Main {
		m := newTestMain(logs, io.Discard)
		if err := m.ParseFlags(context.Background(), args("--shards", "2", "--park")); err != nil {
			t.Fatal(err)
		}
		if err := m.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	p := parked()
	before, since := queued(), time.Now()
	if !strings.Contains(logs.String(), `"msg":"beatd parked: running the embedded etcd member only`) {
		t.Errorf("no parked line in the log:\n%s", logs.String())
	}
	if st := parkedStatus(p); st.ShardCount != 2 || st.Resize != "" || !strings.Contains(st.Why, "--park") {
		t.Errorf("parked /status: %+v, want 2 shards and no resize", st)
	}
	if code, body := get(p, http.MethodGet, "/readyz"); code != http.StatusOK {
		t.Errorf("parked /readyz: %d %s", code, body)
	}
	for _, path := range []string{"/api/v1/entries/a/trigger", "/entries/a/pause", "/api/v1/entries"} {
		if code, body := get(p, http.MethodPost, path); code != http.StatusServiceUnavailable || !strings.Contains(body, "parked: this replica runs its etcd member only") {
			t.Errorf("POST %s on a parked replica: %d %s", path, code, body)
		}
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testutil.Eventually(t, 10*time.Second, "a resize of the parked cluster, killed after staging", func() bool {
		_, err := reshard.Resize(ctx, reshard.Options{Client: cli, Prefix: keys.DefaultPrefix, To: 4, By: "test", StopAfter: "staged"})
		switch {
		case err != nil && strings.Contains(err.Error(), "stopped after staging"):
			return true
		case errors.Is(err, reshard.ErrRefused) && (strings.Contains(err.Error(), "running") || strings.Contains(err.Error(), "has a candidate")):
			return false // the stopped replica's leases, revoked or expiring
		}
		t.Fatalf("a resize of the parked cluster: %v", err)
		return false
	})
	lock, err := cli.Get(ctx, keys.ResizeLock(keys.DefaultPrefix))
	if err != nil || len(lock.Kvs) != 1 {
		t.Fatalf("the killed resize's lock: %v", err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(lock.Kvs[0].Lease)); err != nil { // as its expiry would
		t.Fatal(err)
	}
	if d := 1500*time.Millisecond - time.Since(since); d > 0 {
		time.Sleep(d) // slots come due every second
	}
	if after := queued(); after != before {
		t.Errorf("the queue grew from %d to %d while the replica was parked", before, after)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// Mid-resize: unparked is refused, parked starts and shows it.
	u := newTestMain(io.Discard, io.Discard)
	if err := u.ParseFlags(context.Background(), args("--shards", "4")); err != nil {
		t.Fatal(err)
	}
	err = u.Run(context.Background())
	_ = u.Close()
	if !errors.Is(err, reshard.ErrResizing) {
		t.Fatalf("an unparked start mid-resize: %v, want %v", err, reshard.ErrResizing)
	}
	p = parked()
	if st := parkedStatus(p); !strings.HasPrefix(st.Resize, "2 -> 4 since ") || !strings.Contains(st.Resize, "by test, unfinished") {
		t.Errorf("parked /status mid-resize: %+v, want the resize 2 -> 4, unfinished", st)
	}
	res, err := reshard.Resize(ctx, reshard.Options{Client: cli, Prefix: keys.DefaultPrefix, To: 4, By: "test"})
	if err != nil || !res.Resumed || res.Entries != 3 {
		t.Fatalf("finishing the resize on the parked member: %+v, %v", res, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	resumed := queued()
	runMain(t, args("--shards", "4")...)
	testutil.Eventually(t, 20*time.Second, "fires at 4 shards", func() bool { return queued() >= resumed+6 })
}

// TestShardDrainFlag: --shard-drain-timeout (BEATD_SHARD_DRAIN_TIMEOUT)
// sets the drain's budget, 10 s by default, and refuses what is not a
// bounded duration before anything starts.
func TestShardDrainFlag(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		drain time.Duration
		err   string
	}{
		{name: "default", drain: shardDrainBudget},
		{name: "flag", args: []string{"--shard-drain-timeout", "45s"}, drain: 45 * time.Second},
		{name: "environment", env: map[string]string{"BEATD_SHARD_DRAIN_TIMEOUT": "1m"}, drain: time.Minute},
		{name: "none: let every shard go at once", args: []string{"--shard-drain-timeout", "0s"}},
		{name: "negative", args: []string{"--shard-drain-timeout", "-1s"}, err: "--shard-drain-timeout must be between 0 and 10m0s, not -1s"},
		{name: "past the bound", args: []string{"--shard-drain-timeout", "11m"}, err: "--shard-drain-timeout must be between 0 and 10m0s, not 11m0s"},
		{name: "not a duration", args: []string{"--shard-drain-timeout", "10"}, err: "shard-drain-timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := parsedFlags(t, tt.args, tt.env, tt.err)
			if m == nil {
				return
			}
			if m.ShardDrain != tt.drain {
				t.Errorf("ShardDrain = %s, want %s", m.ShardDrain, tt.drain)
			}
		})
	}
}

// parsedFlags is a Main with args parsed and checked (ParseFlags runs
// CheckFlags) under env; or, when wantErr is set, nil once the parse has
// failed with an error saying it.
func parsedFlags(t *testing.T, args []string, env map[string]string, wantErr string) *Main {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	m := newTestMain(io.Discard, io.Discard)
	err := m.ParseFlags(context.Background(), args)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("ParseFlags: %v, want an error saying %q", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}
