package livetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestParkedResizeEmbedded resizes the embedded topology, where every
// replica is an etcd member, by the procedure of docs/shards.md: three
// replicas at --shards 2 fire; each is restarted with --park (rolling,
// each SIGTERM handing its shards to the others until the last); a
// resize to 4 begun and killed after staging leaves the resize
// unfinished, and a parked member restarted then rejoins (its member is
// needed for the quorum); `beatd shards resize 4 --broker` finishes it on
// the parked members' etcd; each is restarted unparked at --shards 4 and
// the entries fire again. While every replica is parked nothing is
// published, and every slot from the first start to the end is in Redis
// exactly once (catchup: all, so the slots due while parked are
// published late, not missed). --park with --etcd-endpoints is refused.
func TestParkedResizeEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-member embedded cluster through a resize for ~40 s")
	}
	const entries, queue = 12, "parkq"
	rs := testutil.MustStartRedis(t)
	dir := t.TempDir()
	cfgPath := writeFile(t, dir, "schedules.yaml", shardSchedule(entries, queue))
	cfg, err := config.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	clientURLs, members := make([]string, n), make([]string, n)
	for i := range n {
		clientURLs[i] = "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
		members[i] = fmt.Sprintf("m%d=http://127.0.0.1:%d", i, testutil.FreePort(t))
	}
	endpoints := strings.Join(clientURLs, ",")
	start := func(i int, extra ...string) *proc {
		id := fmt.Sprintf("m%d", i)
		p := startBeatd(t, nil, append([]string{"--id", id, "--config", cfgPath, "--broker", rs.URL(0),
			"--data-dir", filepath.Join(dir, id), "--lease-ttl", "2s", "--state-interval", "1s", "--log-fires", "0",
			"--etcd-initial-cluster", strings.Join(members, ","), "--etcd-name", id,
			"--etcd-advertise-client-url", clientURLs[i], "--etcd-insecure-ok"}, extra...)...)
		p.ID = id
		return p
	}
	ps := make([]*proc, n)
	for i := range n {
		ps[i] = start(i, "--shards", "2")
	}
	unparked := func() []*proc {
		var out []*proc
		for _, p := range ps {
			if p.Running() && !strings.Contains(p.output(), "beatd parked") {
				out = append(out, p)
			}
		}
		return out
	}
	ids := func(ps []*proc) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.ID)
		}
		return out
	}
	waitBalanced := func(what string, shards int) {
		t.Helper()
		waitFor(t, 60*time.Second, what, func() bool {
			live := unparked()
			return chaos.ShardsBalanced(shardLeaders(t, live, shards), shards, ids(live))
		})
	}
	waitBalanced("3 replicas balanced over 2 shards", 2)
	from := time.Now().Truncate(time.Second).Add(time.Second)
	qlen := func() int64 {
		l, err := rs.Client().LLen(context.Background(), queue).Result()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	waitFor(t, 10*time.Second, "entries to fire at 2 shards", func() bool { return qlen() >= 2*entries })

	// Bad input: --park keeps an embedded member; with --etcd-endpoints
	// there is none, and it says so before it starts anything.
	bad := startBeatd(t, nil, "--id", "bad", "--config", cfgPath, "--broker", rs.URL(0), "--etcd-endpoints", endpoints, "--park")
	if !bad.Wait(30 * time.Second) {
		t.Fatalf("--park with --etcd-endpoints did not exit:\n%s", tail(bad.output(), 10))
	}
	if out := bad.output(); bad.ExitCode() != 2 || !strings.Contains(out, "--park keeps this replica's embedded etcd member") ||
		!strings.Contains(out, "with --etcd-endpoints it has no member to keep") {
		t.Errorf("--park with --etcd-endpoints: exit %d, want 2 (a usage error) and a clear refusal:\n%s", bad.ExitCode(), tail(out, 5))
	}

	// Rolling restart, parked: each SIGTERM hands its shards to the
	// others, until the last; each parked member rejoins etcd's quorum.
	cli, err := clientv3.New(clientv3.Config{Endpoints: clientURLs, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	park := func(i int) {
		t.Helper()
		ps[i].stop()
		if code := ps[i].ExitCode(); code != 0 {
			t.Fatalf("%s exited %d after SIGTERM", ps[i].ID, code)
		}
		began := time.Now()
		ps[i] = start(i, "--shards", "2", "--park")
		p := ps[i]
		waitFor(t, 30*time.Second, p.ID+" parked and ready", func() bool {
			code, _ := p.get("/readyz")
			st := p.status(t)
			return code == http.StatusOK && st.Parked != nil
		})
		t.Logf("%s parked and ready %s after its start", p.ID, time.Since(began).Round(10*time.Millisecond))
	}
	for i := range n {
		park(i)
		if live := unparked(); len(live) > 0 {
			waitBalanced(fmt.Sprintf("%s parked: %v lead both shards", ps[i].ID, ids(live)), 2)
		}
	}
	parkedAt := time.Now()
	before := qlen()

	// A resize that dies after staging leaves the cluster mid-resize; a
	// parked member restarted now must rejoin, or the resize loses a
	// member of its quorum.
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, 15*time.Second, "a resize to run (the stopped replicas' registrations and candidates gone)", func() bool {
		_, err := reshard.Resize(rctx, reshard.Options{Client: cli, Prefix: keys.DefaultPrefix, To: 4, By: "test", StopAfter: "staged"})
		switch {
		case err != nil && strings.Contains(err.Error(), "stopped after staging"):
			return true
		case errors.Is(err, reshard.ErrRefused) && (strings.Contains(err.Error(), "running") || strings.Contains(err.Error(), "has a candidate")):
			return false
		}
		t.Fatalf("a resize of the parked cluster: %v", err)
		return false
	})
	park(1)
	if st := ps[1].status(t); st.Parked == nil || !strings.HasPrefix(st.Parked.Resize, "2 -> 4 since") || st.Parked.ShardCount != 2 {
		t.Errorf("a parked member restarted mid-resize: /status parked = %+v, want the resize 2 -> 4 shown", st.Parked)
	}

	// `beatd shards resize 4` finishes it on the parked members' etcd,
	// once the killed resize's lock is gone: its lease is revoked here, as
	// its expiry (10 s) would, to keep the test short.
	lock, err := cli.Get(rctx, keys.ResizeLock(keys.DefaultPrefix))
	if err != nil || len(lock.Kvs) != 1 {
		t.Fatalf("the killed resize's lock: %v, %d keys", err, len(lock.Kvs))
	}
	if _, err := cli.Revoke(rctx, clientv3.LeaseID(lock.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	var resized string
	waitFor(t, 30*time.Second, "beatd shards resize 4 to finish", func() bool {
		cmd := exec.Command(beatdBin, "shards", "resize", "4", "--broker", rs.URL(0), "--etcd-endpoints", endpoints)
		b, err := cmd.CombinedOutput()
		resized = string(b)
		if err != nil && !strings.Contains(resized, "is in progress since") {
			t.Fatalf("beatd shards resize 4: %v\n%s", err, resized)
		}
		return err == nil
	})
	t.Logf("%s", strings.TrimSpace(resized))
	if !strings.Contains(resized, "resized 2 -> 4 shards") || !strings.Contains(resized, "finished an unfinished resize") {
		t.Errorf("beatd shards resize 4 said:\n%s", resized)
	}

	// Parked replicas publish nothing: the queue did not grow while every
	// replica was parked, though 12 entries came due every second.
	if d := time.Since(parkedAt); d < 3*time.Second {
		time.Sleep(3*time.Second - d)
	}
	if after := qlen(); after != before {
		t.Errorf("the queue grew from %d to %d messages while every replica was parked", before, after)
	}
	for _, p := range ps {
		if o := p.output(); strings.Contains(o, `"msg":"scheduling"`) || strings.Contains(o, `"msg":"fired"`) {
			t.Errorf("parked %s scheduled or fired:\n%s", p.ID, tail(o, 10))
		}
		if code, body := p.get("/metrics"); code != http.StatusOK || !strings.Contains(body, "\nbeatd_parked 1\n") ||
			!strings.Contains(body, "\nbeatd_etcd_client_unauthenticated 0\n") || strings.Contains(body, "beatd_fires_total") {
			t.Errorf("parked %s /metrics: %d, want beatd_parked 1 and its member's beatd_etcd_client_unauthenticated 0, no scheduler series:\n%s", p.ID, code, tail(body, 20))
		}
		req, _ := http.NewRequest(http.MethodPost, p.URL("/api/v1/entries/tenant-00/trigger"), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "parked") {
			t.Errorf("parked %s answered a trigger %d: %s", p.ID, resp.StatusCode, body)
		}
	}
	if kvs := etcdValues(t, cli, keys.Replicas(keys.DefaultPrefix)); len(kvs) > 0 {
		t.Errorf("parked replicas registered: %v", kvs)
	}

	// Unparked at the new count, rolling: the entries fire again.
	unparkedAt := time.Now()
	for i := range n {
		ps[i].stop()
		ps[i] = start(i, "--shards", "4")
		if i == 0 {
			waitFor(t, 30*time.Second, "m0 to lead every shard at 4", func() bool { return shardLeaders(t, ps[:1], 4) != nil })
			t.Logf("m0 restarted unparked leads all 4 shards %s after its SIGTERM", time.Since(unparkedAt).Round(10*time.Millisecond))
		}
	}
	waitBalanced("3 replicas balanced over 4 shards", 4)
	t.Logf("3 replicas balanced over 4 shards %s after the first unparked restart began", time.Since(unparkedAt).Round(10*time.Millisecond))
	resumed := qlen()
	waitFor(t, 15*time.Second, "entries to fire at 4 shards", func() bool { return qlen() >= resumed+3*entries })
	time.Sleep(2 * time.Second)
	to := time.Now().Truncate(time.Second).Add(-2 * time.Second)

	msgs, err := chaos.ReadQueue(context.Background(), rs.Client(), queue)
	if err != nil {
		t.Fatal(err)
	}
	r := chaos.Audit(cfg, msgs, from, to)
	t.Logf("audited %d slots of %d entries from %s to %s (parked from %s): %d duplicate, %d missed, %d dropped",
		r.ExpectedSlots, entries, from.Format(time.TimeOnly), to.Format(time.TimeOnly), parkedAt.Format(time.TimeOnly),
		len(r.Duplicates), len(r.Missed), len(r.Dropped))
	for _, d := range r.Duplicates[:min(5, len(r.Duplicates))] {
		t.Errorf("duplicate: %s at %s, %d times", d.Entry, d.Slot.Format(time.RFC3339), d.Count)
	}
	for _, m := range r.Missed[:min(5, len(r.Missed))] {
		t.Errorf("missed: %s at %s", m.Entry, m.Slot.Format(time.RFC3339))
	}
	if !r.OK || len(r.Dropped) > 0 || r.ExpectedSlots < entries*10 {
		t.Errorf("audit: ok %v, %d dropped, %d slots expected", r.OK, len(r.Dropped), r.ExpectedSlots)
	}
}
