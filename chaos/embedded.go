package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Topologies of a local drill.
const (
	// TopologyExternal: the replicas use a separate 3-member etcd cluster.
	TopologyExternal = "external"
	// TopologyEmbedded: each replica runs one member of an etcd cluster the
	// replicas form (--etcd-initial-cluster); killing a replica kills a
	// member.
	TopologyEmbedded = "embedded"
)

// member is a replica's embedded etcd member, as the drill wires it.
type member struct {
	clientURL string // advertised (through the fabric)
}

func (d *drill) embedded() bool { return d.cfg.Topology == TopologyEmbedded }

// setupEmbedded starts redis-server and the replicas, each hosting one
// member, with every etcd port behind the fabric.
func (d *drill) setupEmbedded() error {
	var err error
	if d.redis, err = harness.StartRedis(d.dir, true); err != nil {
		return err
	}
	d.fabric = NewFabric(func() map[int]int {
		out := map[int]int{}
		for i, r := range d.replicas {
			if r.Running() {
				out[r.Proc().Pid()] = i
			}
		}
		return out
	})
	config := filepath.Join(d.dir, "drill.yaml")
	if err := os.WriteFile(config, []byte(DrillSchedule), 0o644); err != nil {
		return err
	}
	n := d.cfg.Replicas
	type ports struct{ peer, client, peerAdv, clientAdv string }
	ps := make([]ports, n)
	var initial []string
	for i := 0; i < n; i++ {
		pp, err := harness.FreePort()
		if err != nil {
			return err
		}
		cp, err := harness.FreePort()
		if err != nil {
			return err
		}
		ps[i].peer, ps[i].client = "127.0.0.1:"+strconv.Itoa(pp), "127.0.0.1:"+strconv.Itoa(cp)
		if ps[i].peerAdv, err = d.fabric.Listen(i, ps[i].peer); err != nil {
			return err
		}
		if ps[i].clientAdv, err = d.fabric.Listen(i, ps[i].client); err != nil {
			return err
		}
		initial = append(initial, fmt.Sprintf("drill-%d=http://%s", i, ps[i].peerAdv))
		d.members = append(d.members, member{clientURL: "http://" + ps[i].clientAdv})
	}
	for i := 0; i < n; i++ {
		r := &Replica{Replica: &harness.Replica{ID: fmt.Sprintf("drill-%d", i), Bin: d.cfg.Binary,
			LogPath: filepath.Join(d.dir, fmt.Sprintf("replica-%d.log", i))}}
		if r.RedisProxy, err = harness.NewProxy(d.redis.Addr()); err != nil {
			return err
		}
		if r.HTTPPort, err = harness.FreePort(); err != nil {
			return err
		}
		r.Args = []string{"run", "--config", config, "--data-dir", filepath.Join(d.dir, r.ID),
			"--etcd-initial-cluster", strings.Join(initial, ","), "--etcd-initial-cluster-token", "beatd-drill",
			"--etcd-advertise-client-url", "http://" + ps[i].clientAdv, "--etcd-listen-client-url", "http://" + ps[i].client,
			"--etcd-listen-peer-url", "http://" + ps[i].peer,
			"--broker", "redis://" + r.RedisProxy.Addr() + "/0", "--id", r.ID, "--lease-ttl", d.cfg.LeaseTTL.String(),
			"--prefix", d.prefix, "--http", "127.0.0.1:" + strconv.Itoa(r.HTTPPort), "--log-format", "json"}
		d.replicas = append(d.replicas, r)
	}
	// Together, as a StatefulSet with podManagementPolicy Parallel.
	for _, r := range d.replicas {
		if err := r.Start(); err != nil {
			return err
		}
	}
	var eps []string
	for _, m := range d.members {
		eps = append(eps, m.clientURL)
	}
	if d.cli, err = clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()}); err != nil {
		return err
	}
	if err := d.waitMembersHealthy(60 * time.Second); err != nil {
		return err
	}
	d.logf("embedded cluster up: %d replicas each hosting an etcd member, redis %s, lease TTL %s, work dir %s",
		len(d.replicas), d.redis.Addr(), d.cfg.LeaseTTL, d.dir)
	return nil
}

// waitMembersHealthy waits until every member answers and a write commits.
func (d *drill) waitMembersHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = d.cli.Put(ctx, "/health-probe", "1")
		for _, m := range d.members {
			if err == nil {
				_, err = d.cli.Status(ctx, m.clientURL)
			}
		}
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("chaos: embedded members not healthy after %s: %w", timeout, err)
}

// raftLeader returns the replica whose member leads raft.
func (d *drill) raftLeader(ctx context.Context) (int, error) {
	for i, m := range d.members {
		if !d.replicas[i].Running() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := d.cli.Status(sctx, m.clientURL)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	return -1, errors.New("no raft leader")
}

func (d *drill) index(r *Replica) int {
	for i, x := range d.replicas {
		if x == r {
			return i
		}
	}
	return -1
}

// injectEmbedded applies the etcd faults to the replicas' own members:
// killing a member kills its replica. It reports false for the faults
// that work as in the external topology.
func (d *drill) injectEmbedded(ctx context.Context, f *Fault, lead *Replica) (bool, error) {
	var err error
	switch f.Kind {
	case FaultEtcdKill:
		// The member that leads raft is, by design, not the beatd
		// leader's: this kills a standby and its member.
		i, rerr := d.raftLeader(ctx)
		if rerr != nil {
			i = d.rng.IntN(len(d.replicas))
		}
		r := d.replicas[i]
		f.Target = r.ID + " (raft leader)"
		r.Kill()
		f.Held = time.Duration(1000+d.rng.IntN(2000)) * time.Millisecond
		if err := d.sleep(ctx, f.Held); err != nil {
			return true, err
		}
		err = r.Start()
	case FaultEtcdQuorum:
		perm := d.rng.Perm(len(d.replicas))
		a, b := d.replicas[perm[0]], d.replicas[perm[1]]
		f.Target = a.ID + "," + b.ID
		a.Kill()
		b.Kill()
		f.Held = time.Duration(2000+d.rng.IntN(3000)) * time.Millisecond
		if err := d.sleep(ctx, f.Held); err != nil {
			return true, err
		}
		if err = a.Start(); err == nil {
			err = b.Start()
		}
		if err == nil {
			err = d.waitMembersHealthy(60 * time.Second)
		}
	case FaultPartition:
		// Cut the leader's pod off from etcd (its member from its peers, its
		// client from theirs), or from Redis.
		if d.rng.IntN(2) == 1 {
			return false, nil
		}
		f.Target = lead.ID + "->etcd"
		d.fabric.Isolate(d.index(lead))
		f.Held = d.cfg.LeaseTTL + time.Duration(500+d.rng.IntN(1500))*time.Millisecond
		serr := d.sleep(ctx, f.Held)
		d.fabric.Heal()
		if serr != nil {
			return true, serr
		}
	default:
		return false, nil
	}
	// A stopped or killed replica is restarted by the fault itself; make
	// sure none stays down (a SIGSTOP'd one is resumed by FaultStop).
	for _, r := range d.replicas {
		if !r.Running() && err == nil {
			err = r.Start()
		}
	}
	return true, err
}
