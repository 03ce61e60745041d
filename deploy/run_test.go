package deploy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runSchedule replaces the manifest's example schedule: 1-second entries
// that catch up every missed slot, so the audit can demand every slot.
const runSchedule = `defaults:
  options: {queue: deploytest}
  catchup: all
  catchup_window: 10m
entries:
  a: {task: t.a, every: 1s}
  b: {task: t.b, every: 1s, args: [1]}
`

// embeddedCluster is the embedded StatefulSet's three pods on loopback.
type embeddedCluster struct {
	t      *testing.T
	r      *rendered
	pods   []*pod
	cli    *clientv3.Client
	prefix string
	ttl    time.Duration
	pn     *podNet
	opt    podOptions
}

func startEmbedded(t *testing.T, broker string, extraEnv ...string) *embeddedCluster {
	t.Helper()
	return startRendering(t, "embedded", podOptions{broker: broker, extraEnv: extraEnv}, nil)
}

// startRendering runs a rendering's StatefulSet as processes; clientTLS is
// how the test's own etcd client reaches the members (nil: plain).
func startRendering(t *testing.T, name string, opt podOptions, clientTLS *tls.Config) *embeddedCluster {
	t.Helper()
	r := render(t, name)
	c := container(t, r)
	var cports []int32
	for _, p := range c.Ports {
		cports = append(cports, p.ContainerPort)
	}
	n := int(*r.sts.Spec.Replicas)
	// Ports for two more pods than the StatefulSet has: the test scales
	// up to five.
	pn := newPodNet(t, r.sts.Name, r.sts.Spec.ServiceName, n+2, cports)
	opt.schedule, opt.base = runSchedule, t.TempDir()
	ec := &embeddedCluster{t: t, r: r, pn: pn, opt: opt}
	for i := 0; i < n; i++ {
		ec.pods = append(ec.pods, buildPod(t, r, pn, i, ec.opt))
	}
	ttl, err := time.ParseDuration(ec.pods[0].envValue("BEATD_LEASE_TTL"))
	if err != nil {
		t.Fatalf("BEATD_LEASE_TTL: %v", err)
	}
	ec.ttl, ec.prefix = ttl, ec.pods[0].envValue("BEATD_PREFIX")
	t.Cleanup(func() {
		for _, p := range ec.pods {
			p.kill()
		}
		if t.Failed() {
			for _, p := range ec.pods {
				b, _ := os.ReadFile(p.log)
				lines := strings.Split(string(b), "\n")
				if len(lines) > 30 {
					lines = lines[len(lines)-30:]
				}
				t.Logf("--- %s log tail ---\n%s", p.name, strings.Join(lines, "\n"))
			}
		}
	})
	for _, p := range ec.pods {
		p.start(t)
	}
	ec.cli = etcdClient(t, ec.pods, clientTLS)
	return ec
}

// leader waits for a leader other than not, with a token above minToken,
// and returns its pod.
func (ec *embeddedCluster) leader(not string, minToken int64, timeout time.Duration) (*pod, election.Leader) {
	ec.t.Helper()
	var l election.Leader
	waitFor(ec.t, timeout, "a beatd leader other than "+not, func() bool {
		var err error
		l, err = observe(ec.cli, ec.prefix)
		return err == nil && l.ID != not && l.Token > minToken
	})
	for _, p := range ec.pods {
		if p.name == l.ID {
			return p, l
		}
	}
	ec.t.Fatalf("leader %q is no pod", l.ID)
	return nil, l
}

// healthyMembers waits until the cluster has n started members that all
// answer a status request, and returns their ids.
func (ec *embeddedCluster) healthyMembers(n int, timeout time.Duration) map[string]uint64 {
	ec.t.Helper()
	ids := map[string]uint64{}
	waitFor(ec.t, timeout, fmt.Sprintf("%d healthy etcd members", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ml, err := ec.cli.MemberList(ctx)
		if err != nil || len(ml.Members) != n {
			return false
		}
		clear(ids)
		for _, m := range ml.Members {
			if len(m.ClientURLs) == 0 {
				return false
			}
			// The member at that URL must be this member: a replica that
			// rejoined under a new id serves the same URL.
			st, err := ec.cli.Status(ctx, m.ClientURLs[0])
			if err != nil || st.Header.MemberId != m.ID {
				return false
			}
			ids[m.Name] = m.ID
		}
		return true
	})
	return ids
}

// TestEmbeddedStatefulSetAsProcesses runs the embedded StatefulSet's
// container exactly as the manifest describes it (pod names substituted,
// DNS names mapped to loopback ports) as three processes, and breaks it:
// a kill -9 of the leader, two of three replicas down, a wiped volume.
// Every slot must reach Redis exactly once.
func TestEmbeddedStatefulSetAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three beatd processes")
	}
	rs := testutil.MustStartRedis(t)
	rdb := rs.Client()
	ec := startEmbedded(t, rs.URL(0))
	count := func() int {
		n, err := rdb.LLen(context.Background(), "deploytest").Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}

	// Bootstrap: three members, one leader, publishing.
	lead, l1 := ec.leader("", 0, 60*time.Second)
	start := time.Now()
	ids := ec.healthyMembers(3, 30*time.Second)
	waitFor(t, 10*time.Second, "publishing", func() bool { return count() >= 4 })
	// The probes' paths answer on each pod's HTTP port.
	for _, p := range ec.pods {
		for _, probe := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get("http://" + p.httpAddr + probe)
			if err != nil {
				t.Fatalf("%s %s: %v", p.name, probe, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s %s: %d", p.name, probe, resp.StatusCode)
			}
		}
	}
	t.Logf("bootstrapped: members %v, leader %s (token %d)", ids, l1.ID, l1.Token)

	// kill -9 of the leader: a new leader within TTL + 2 s.
	killed := time.Now()
	lead.kill()
	lead2, l2 := ec.leader(lead.name, 0, ec.ttl+10*time.Second)
	failover := time.Since(killed)
	if failover > ec.ttl+2*time.Second {
		t.Errorf("kill -9 failover took %s, want within the TTL %s + 2s", failover, ec.ttl)
	}
	if l2.Token <= l1.Token {
		t.Errorf("token %d not above %d", l2.Token, l1.Token)
	}
	t.Logf("kill -9 of %s: %s led after %s", lead.name, lead2.name, failover.Round(time.Millisecond))
	lead.start(t) // it rejoins with its data
	ec.healthyMembers(3, 30*time.Second)

	// Two of three down: no quorum, nobody publishes. The leader stays up
	// and must stop by itself within its TTL.
	var down []*pod
	for _, p := range ec.pods {
		if p != lead2 {
			down = append(down, p)
		}
	}
	killedTwo := time.Now()
	for _, p := range down {
		p.kill()
	}
	time.Sleep(ec.ttl + time.Second) // the lease a leader held before the quorum went cannot outlive this
	before := count()
	time.Sleep(3 * time.Second) // proves a negative: no publish without a quorum
	if after := count(); after != before {
		t.Errorf("%d publishes without an etcd quorum", after-before)
	}
	restored := time.Now()
	for _, p := range down {
		p.start(t)
	}
	// The leader stepped down without quorum, so a new term follows.
	_, l3 := ec.leader("", l2.Token, 60*time.Second)
	t.Logf("quorum lost for %s; %s led (token %d) %s after the restore", restored.Sub(killedTwo).Round(time.Millisecond),
		l3.ID, l3.Token, time.Since(restored).Round(time.Millisecond))
	ec.healthyMembers(3, 30*time.Second)

	// A lost volume: a replica comes back with an empty data dir, rejoins
	// under a new member id, and the cluster has three healthy members.
	var victim *pod
	for _, p := range ec.pods {
		if p.name != l3.ID {
			victim = p
		}
	}
	victim.kill()
	if err := os.RemoveAll(victim.dataDir(ec.r)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(victim.dataDir(ec.r), 0o755); err != nil {
		t.Fatal(err)
	}
	victim.start(t)
	after := ec.healthyMembers(3, 60*time.Second)
	if after[victim.name] == ids[victim.name] || after[victim.name] == 0 {
		t.Errorf("%s: member id %x before the wipe, %x after: want a new member", victim.name, ids[victim.name], after[victim.name])
	}

	// Scale 3 -> 5 -> 3 while firing: the new pods are not in the
	// bootstrap list and join by themselves, one after the other; after
	// the scale-down (highest ordinal first, as a StatefulSet does) each
	// member is removed with `beatd members remove`, as deploy/README.md
	// says. The audit below covers it.
	members := func(args ...string) string {
		out, err := exec.Command(beatdBin(), append(append([]string{"members"}, args...),
			"--etcd-endpoints", ec.pods[0].envValue("BEATD_ETCD_ADVERTISE_CLIENT_URL"))...).CombinedOutput()
		if err != nil {
			t.Fatalf("beatd members %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var extras []*pod
	for n := 4; n <= 5; n++ {
		extra := buildPod(t, ec.r, ec.pn, len(ec.pods), ec.opt)
		ec.pods = append(ec.pods, extra)
		extras = append(extras, extra)
		extra.start(t)
		ec.healthyMembers(n, 60*time.Second)
	}
	var listed []struct {
		Name    string `json:"name"`
		Healthy bool   `json:"healthy"`
	}
	if err := json.Unmarshal([]byte(members("list", "--json")), &listed); err != nil || len(listed) != 5 {
		t.Fatalf("beatd members list: %v %v", listed, err)
	}
	for _, m := range listed {
		if !m.Healthy {
			t.Errorf("member %s unhealthy at 5 members", m.Name)
		}
	}
	for i := len(extras) - 1; i >= 0; i-- {
		extra := extras[i]
		if !extra.term(30 * time.Second) {
			t.Errorf("%s did not exit within 30s of SIGTERM", extra.name)
		}
		members("remove", extra.name)
		ec.pods = ec.pods[:len(ec.pods)-1]
		ec.healthyMembers(len(ec.pods), 30*time.Second)
	}
	t.Logf("scaled to 5 members and back to 3:\n%s", members("list"))

	// Every slot exactly once, across all of it: audit up to a slot that
	// every entry has published (on a loaded machine a publish can lag).
	end := time.Now().Truncate(time.Second)
	waitPublished(t, rdb, "deploytest", end, 2)
	// All at once, as `kubectl delete` does: each member's stop waits up
	// to etcd's request timeout for the other replicas' watch streams.
	var wg sync.WaitGroup
	for _, p := range ec.pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !p.term(30 * time.Second) {
				t.Errorf("%s did not exit within 30s of SIGTERM", p.name)
			}
		}()
	}
	wg.Wait()
	msgs, err := chaos.ReadQueue(context.Background(), rdb, "deploytest")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("schedules.yaml", []byte(runSchedule))
	if err != nil {
		t.Fatal(err)
	}
	rep := chaos.Audit(cfg, msgs, start.Add(time.Second), end)
	if len(rep.Duplicates) > 0 || len(rep.Missed) > 0 || rep.ExpectedSlots == 0 {
		t.Errorf("audit: %d duplicates %v, %d missed %v, %d slots", len(rep.Duplicates), rep.Duplicates, len(rep.Missed), rep.Missed, rep.ExpectedSlots)
	}
	t.Logf("%d messages, %d slots audited: 0 duplicates, 0 missed", len(msgs), rep.ExpectedSlots)
}

// waitPublished waits until each of the schedule's n entries has
// published a slot at or after end into queue.
func waitPublished(t *testing.T, rdb *redis.Client, queue string, end time.Time, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, "every entry to publish the slot "+end.Format(time.TimeOnly), func() bool {
		msgs, err := chaos.ReadQueue(context.Background(), rdb, queue)
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, m := range msgs {
			if !m.Slot.Before(end) {
				seen[m.Entry] = true
			}
		}
		return len(seen) == n
	})
}
