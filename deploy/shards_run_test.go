package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// shardSchedule is eight 1-second entries, spread over the 4 shards.
var shardSchedule = func() string {
	var b strings.Builder
	b.WriteString("defaults:\n  options: {queue: deploytest}\n  catchup: all\n  catchup_window: 10m\nentries:\n")
	for i := range 8 {
		fmt.Fprintf(&b, "  s%d: {task: t.s, every: 1s, args: [%d]}\n", i, i)
	}
	return b.String()
}()

// TestShardedStatefulSetsAsProcesses runs each topology's StatefulSet,
// rendered with the operator's one shard setting (shards=4 in the
// beatd-cluster ConfigMap), as three processes exactly as the manifest
// describes them: the embedded members form their own etcd, the external
// one reaches a real etcd the test runs. Every replica gets the count, the
// cluster records it, the three replicas share the 4 shards, and when one
// gets SIGTERM the other two lead its shards. Every slot reaches Redis
// exactly once.
func TestShardedStatefulSetsAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three beatd processes per topology")
	}
	rs := testutil.MustStartRedis(t)
	rdb := rs.Client()
	for _, name := range []string{"embedded+shards", "external+shards"} {
		t.Run(name, func(t *testing.T) {
			queue := "deploytest"
			rdb.Del(context.Background(), queue)
			r := render(t, name)
			c := container(t, r)
			var cports []int32
			for _, p := range c.Ports {
				cports = append(cports, p.ContainerPort)
			}
			n := int(*r.sts.Spec.Replicas)
			pn := newPodNet(t, r.sts.Name, r.sts.Spec.ServiceName, n, cports)
			opt := podOptions{schedule: shardSchedule, broker: rs.URL(0), base: t.TempDir()}
			var cli *clientv3.Client
			if strings.HasPrefix(name, "external") {
				srv := testutil.MustStartEmbeddedEtcd(t)
				opt.extraEnv = []string{"BEATD_ETCD_ENDPOINTS=" + strings.Join(srv.Endpoints, ",")}
				cli = testutil.NewEtcdClient(t, srv.Endpoints...)
			}
			var pods []*pod
			for i := range n {
				pods = append(pods, buildPod(t, r, pn, i, opt))
			}
			t.Cleanup(func() {
				for _, p := range pods {
					p.kill()
				}
			})
			for _, p := range pods {
				if got := p.envValue("BEATD_SHARDS"); got != "4" {
					t.Fatalf("%s: BEATD_SHARDS=%q, want 4", p.name, got)
				}
				p.start(t)
			}
			if cli == nil {
				cli = etcdClient(t, pods, nil)
			}
			prefix := pods[0].envValue("BEATD_PREFIX")
			led := func() map[string]int { return shardsLed(cli, prefix, 4) }
			waitFor(t, 60*time.Second, "3 pods sharing the 4 shards", func() bool {
				l := led()
				return len(l) == 3
			})
			waitEveryEntryFired(t, rdb, queue)
			start := time.Now()
			resp, err := cli.Get(context.Background(), keys.ShardCount(prefix))
			if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "4" {
				t.Fatalf("the cluster's recorded shard count: %v %v, want 4", resp, err)
			}
			time.Sleep(2 * time.Second)
			if !pods[2].term(30 * time.Second) {
				t.Fatalf("%s did not exit within 30s of SIGTERM", pods[2].name)
			}
			waitFor(t, 15*time.Second, "the 2 pods left leading 2 shards each", func() bool {
				l := led()
				return l[pods[0].name] == 2 && l[pods[1].name] == 2
			})
			end := time.Now().Truncate(time.Second).Add(2 * time.Second)
			waitPublished(t, rdb, queue, end, 8)
			for _, p := range pods[:2] {
				if !p.term(30 * time.Second) {
					t.Errorf("%s did not exit within 30s of SIGTERM", p.name)
				}
			}
			// From the second after every entry had fired.
			auditShardSchedule(t, rdb, queue, start.Truncate(time.Second).Add(time.Second), end)
		})
	}
}

// shardsLed is how many shards each pod leads, with every one of count
// shards led (nil while one is not, or the cluster has another count).
func shardsLed(cli *clientv3.Client, prefix string, count int) map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	shards, err := status.Shards(ctx, cli, prefix)
	if err != nil || len(shards) != count {
		return nil
	}
	out := map[string]int{}
	for _, sh := range shards {
		if sh.LeaderID == "" {
			return nil
		}
		out[sh.LeaderID]++
	}
	return out
}

// waitEveryEntryFired waits until each of shardSchedule's 8 entries is in
// queue. A shard's first leader begins scheduling a moment after it is
// elected (its fence, its state), longer on a loaded machine, and an entry
// that never fired starts at its first slot after that: audits start
// from here.
func waitEveryEntryFired(t *testing.T, rdb *redis.Client, queue string) {
	t.Helper()
	waitFor(t, 30*time.Second, "every entry to fire", func() bool {
		msgs, err := chaos.ReadQueue(context.Background(), rdb, queue)
		if err != nil {
			return false
		}
		fired := map[string]bool{}
		for _, m := range msgs {
			fired[m.Entry] = true
		}
		return len(fired) == 8
	})
}

// auditShardSchedule checks that every slot of shardSchedule from from to
// end is in queue exactly once.
func auditShardSchedule(t *testing.T, rdb *redis.Client, queue string, from, end time.Time) {
	t.Helper()
	msgs, err := chaos.ReadQueue(context.Background(), rdb, queue)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("schedules.yaml", []byte(shardSchedule))
	if err != nil {
		t.Fatal(err)
	}
	rep := chaos.Audit(cfg, msgs, from, end)
	if len(rep.Duplicates) > 0 || len(rep.Missed) > 0 || rep.ExpectedSlots == 0 {
		t.Errorf("audit: %d duplicates %v, %d missed %v, %d slots", len(rep.Duplicates), rep.Duplicates, len(rep.Missed), rep.Missed, rep.ExpectedSlots)
	}
	t.Logf("%d messages, %d slots audited from %s to %s: %d duplicates, %d missed",
		len(msgs), rep.ExpectedSlots, from.Format(time.TimeOnly), end.Format(time.TimeOnly), len(rep.Duplicates), len(rep.Missed))
}
