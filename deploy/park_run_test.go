package deploy

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestParkedStatefulSetResize runs deploy/README.md's resize of the
// embedded topology on its StatefulSet, rendered at each step with the
// operator's overlay, as three processes exactly as the manifest
// describes them: at shards=4 the pods share the shards and fire; a
// rolling restart with park=true leaves every pod an etcd member only
// (ready, leading nothing, publishing nothing); `beatd shards resize 8`
// with a parked pod's environment (what `kubectl exec beatd-0` runs)
// resizes on the parked members' etcd; a rolling restart with shards=8,
// park=false shares the 8 shards. Every slot reaches Redis exactly once.
func TestParkedStatefulSetResize(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three beatd processes through two rolling restarts")
	}
	rs := testutil.MustStartRedis(t)
	rdb := rs.Client()
	const queue = "deploytest"
	steps := []*rendered{render(t, "embedded+shards"), render(t, "embedded+shards+park"), render(t, "embedded+shards8")}
	var cports []int32
	for _, p := range container(t, steps[0]).Ports {
		cports = append(cports, p.ContainerPort)
	}
	n := int(*steps[0].sts.Spec.Replicas)
	pn := newPodNet(t, steps[0].sts.Name, steps[0].sts.Spec.ServiceName, n, cports)
	opt := podOptions{schedule: shardSchedule, broker: rs.URL(0), base: t.TempDir()}
	build := func(r *rendered) []*pod {
		var out []*pod
		for i := range n {
			out = append(out, buildPod(t, r, pn, i, opt))
		}
		return out
	}
	pods := build(steps[0])
	t.Cleanup(func() {
		for _, p := range pods {
			p.kill()
		}
	})
	for _, p := range pods {
		p.start(t)
	}
	cli := etcdClient(t, pods, nil)
	prefix := pods[0].envValue("BEATD_PREFIX")
	waitFor(t, 60*time.Second, "3 pods sharing the 4 shards", func() bool { return len(shardsLed(cli, prefix, 4)) == 3 })
	waitEveryEntryFired(t, rdb, queue)
	start := time.Now()

	// 1. park=true, then `kubectl rollout restart`: one pod at a time,
	// each ready (its member answering) before the next.
	get := func(p *pod, path string) (int, string) {
		resp, err := http.Get("http://" + p.httpAddr + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for i, next := range build(steps[1]) {
		if got := next.envValue("BEATD_PARK"); got != "true" {
			t.Fatalf("%s: BEATD_PARK=%q with park=true in the overlay", next.name, got)
		}
		if !pods[i].term(30 * time.Second) {
			t.Fatalf("%s did not exit within 30s of SIGTERM", pods[i].name)
		}
		pods[i] = next
		next.start(t)
		waitFor(t, 30*time.Second, next.name+" parked and ready", func() bool {
			code, _ := get(next, "/readyz")
			_, st := get(next, "/status")
			return code == http.StatusOK && strings.Contains(st, `"parked": {`)
		})
	}
	parkedLen := rdb.LLen(context.Background(), queue).Val()
	parkedAt := time.Now()

	// 2. `kubectl exec beatd-0 -- beatd shards resize 8`: the pod's own
	// environment names the broker and its password file; its member's
	// client port is the pod's 2379, a port of its own here.
	var out []byte
	waitFor(t, 20*time.Second, "beatd shards resize 8 on the parked members", func() bool {
		cmd := exec.Command(beatdBin(), "shards", "resize", "8")
		cmd.Env = append(append(os.Environ(), pods[0].env...), "BEATD_ETCD_ENDPOINTS="+pods[0].envValue("BEATD_ETCD_ADVERTISE_CLIENT_URL"))
		var err error
		out, err = cmd.CombinedOutput()
		if err != nil && !strings.Contains(string(out), "stop every replica first") {
			t.Fatalf("beatd shards resize 8: %v\n%s", err, out)
		}
		return err == nil
	})
	t.Logf("%s", strings.TrimSpace(string(out)))
	if wait := 2*time.Second - time.Since(parkedAt); wait > 0 {
		time.Sleep(wait)
	}
	if l := rdb.LLen(context.Background(), queue).Val(); l != parkedLen {
		t.Errorf("the queue grew from %d to %d messages while every pod was parked", parkedLen, l)
	}

	// 3. shards=8, park=false, then `kubectl rollout restart`.
	for i, next := range build(steps[2]) {
		if !pods[i].term(30 * time.Second) {
			t.Fatalf("%s did not exit within 30s of SIGTERM", pods[i].name)
		}
		pods[i] = next
		next.start(t)
	}
	waitFor(t, 60*time.Second, "3 pods sharing the 8 shards", func() bool { return len(shardsLed(cli, prefix, 8)) == 3 })
	end := time.Now().Truncate(time.Second).Add(2 * time.Second)
	waitPublished(t, rdb, queue, end, 8)
	for _, p := range pods {
		if !p.term(30 * time.Second) {
			t.Errorf("%s did not exit within 30s of SIGTERM", p.name)
		}
	}
	// Across the park, the resize and the unpark.
	auditShardSchedule(t, rdb, queue, start.Truncate(time.Second).Add(time.Second), end)
}
