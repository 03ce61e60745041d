package livetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// embeddedCluster starts n replicas forming one embedded etcd cluster and
// waits until one leads; it returns them and the leader's index.
func embeddedCluster(t *testing.T, n int) ([]*proc, int) {
	t.Helper()
	rs := testutil.MustStartRedis(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(config, []byte("entries:\n  tick: {task: tasks.add, every: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clientPorts, members := make([]int, n), make([]string, n)
	for i := range n {
		clientPorts[i] = testutil.FreePort(t)
		members[i] = fmt.Sprintf("m%d=http://127.0.0.1:%d", i, testutil.FreePort(t))
	}
	ps := make([]*proc, n)
	for i := range n {
		ps[i] = startBeatd(t, nil, "--id", fmt.Sprintf("m%d", i), "--config", config, "--broker", rs.URL(0),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("data%d", i)), "--lease-ttl", "3s",
			"--etcd-initial-cluster", strings.Join(members, ","), "--etcd-name", fmt.Sprintf("m%d", i),
			"--etcd-advertise-client-url", "http://127.0.0.1:"+strconv.Itoa(clientPorts[i]), "--etcd-insecure-ok")
	}
	leader := -1
	testutil.EventuallyEvery(t, 60*time.Second, 100*time.Millisecond, "a leader", func() bool {
		for i, p := range ps {
			if st := p.status(t); st.LeaderID != "" {
				leader = strings.Index("m0m1m2m3m4", st.LeaderID) / 2
				_ = i
				return leader >= 0
			}
		}
		return false
	})
	return ps, leader
}

// sigtermTook SIGTERMs p and returns how long it took to exit.
func sigtermTook(t *testing.T, p *proc) time.Duration {
	t.Helper()
	start := time.Now()
	p.Signal(syscall.SIGTERM)
	if !p.Wait(30 * time.Second) {
		t.Fatalf("no exit 30 s after SIGTERM:\n%s", tail(p.output(), 40))
	}
	took := time.Since(start)
	if p.ExitCode() != 0 {
		t.Errorf("exit code %d, want 0:\n%s", p.ExitCode(), tail(p.output(), 40))
	}
	return took
}

// TestStandbySIGTERMExitsWithinASecond: a standby's SIGTERM stops it in
// about a second in every topology of an embedded cluster: all members
// up, and when its exit leaves a minority of members.
func TestStandbySIGTERMExitsWithinASecond(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-replica embedded cluster")
	}
	const budget = 1500 * time.Millisecond // 1 s, with room for -race on 2 cores
	t.Run("full cluster", func(t *testing.T) {
		ps, leader := embeddedCluster(t, 3)
		standby := ps[(leader+1)%3]
		took := sigtermTook(t, standby)
		t.Logf("standby SIGTERM in a full cluster took %v\n%s", took, tail(standby.output(), 3))
		if took > budget {
			t.Errorf("standby took %v to exit, want ≤ %v:\n%s", took, budget, tail(standby.output(), 40))
		}
	})
	t.Run("leaving a minority", func(t *testing.T) {
		ps, leader := embeddedCluster(t, 3)
		ps[(leader+1)%3].Kill()
		standby := ps[(leader+2)%3]
		time.Sleep(2 * time.Second) // let the cluster notice the dead member, as in production
		took := sigtermTook(t, standby)
		t.Logf("standby SIGTERM leaving 1 of 3 members took %v\n%s", took, tail(standby.output(), 3))
		if took > budget {
			t.Errorf("standby took %v to exit, want ≤ %v:\n%s", took, budget, tail(standby.output(), 40))
		}
	})
}
