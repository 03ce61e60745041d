package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelTopology is a master, a replica and three redis-sentinel
// processes watching them, on free loopback ports. It is meant to be
// started once per package (StartSentinelTopology in TestMain or a
// sync.Once) and failed over by the tests in turn.
type SentinelTopology struct {
	MasterName string
	Nodes      []*RedisProc // the data nodes; either may be the master
	Sentinels  []*RedisProc
}

// StartSentinelTopology starts the topology under dir. Nodes[0] starts as
// the master.
func StartSentinelTopology(dir string) (*SentinelTopology, error) {
	t := &SentinelTopology{MasterName: "beatdmaster"}
	ok := false
	defer func() {
		if !ok {
			t.Stop()
		}
	}()
	for i := 0; i < 2; i++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		d := filepath.Join(dir, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		n := &RedisProc{Bin: "redis-server", Port: port, Dir: d, Args: []string{"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"}}
		if i > 0 {
			n.Args = append(n.Args, "--replicaof", "127.0.0.1", strconv.Itoa(t.Nodes[0].Port))
		}
		if err := n.Start(); err != nil {
			return nil, err
		}
		t.Nodes = append(t.Nodes, n)
	}
	if err := WaitOnlineReplicas(t.Nodes[0].Addr(), 1, 20*time.Second); err != nil {
		return nil, err
	}
	for i := 0; i < 3; i++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		d := filepath.Join(dir, fmt.Sprintf("sentinel%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		// Fast detection (1 s) so a test fails over in a few seconds; a
		// short failover-timeout so failovers can follow each other.
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\nsentinel resolve-hostnames no\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %s 1000\n"+
			"sentinel failover-timeout %s 4000\nsentinel parallel-syncs %s 1\n",
			port, t.MasterName, t.Nodes[0].Port, t.MasterName, t.MasterName, t.MasterName)
		if err := os.WriteFile(filepath.Join(d, "sentinel.conf"), []byte(conf), 0o644); err != nil {
			return nil, err
		}
		s := &RedisProc{Bin: "redis-sentinel", Port: port, Dir: d}
		if err := s.Start(); err != nil {
			return nil, err
		}
		t.Sentinels = append(t.Sentinels, s)
	}
	if err := t.WaitStable(30 * time.Second); err != nil {
		return nil, err
	}
	ok = true
	return t, nil
}

// URL is the Celery broker URL of the sentinels, database db.
func (t *SentinelTopology) URL(db int) string {
	var parts []string
	for _, s := range t.Sentinels {
		parts = append(parts, fmt.Sprintf("sentinel://%s/%d", s.Addr(), db))
	}
	return strings.Join(parts, ";")
}

// Stop stops every process.
func (t *SentinelTopology) Stop() {
	for _, s := range t.Sentinels {
		s.Kill()
	}
	for _, n := range t.Nodes {
		n.Kill()
	}
}

// sentinelDo runs a command on the first sentinel that answers.
func (t *SentinelTopology) sentinelDo(ctx context.Context, args ...any) (any, error) {
	var last error
	for _, s := range t.Sentinels {
		if !s.Running() {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		v, err := c.Do(ctx, args...).Result()
		c.Close()
		if err == nil {
			return v, nil
		}
		last = err
	}
	return nil, fmt.Errorf("sentinel %v: %w", args, last)
}

// MasterAddr is the master's address as every sentinel reports it; an
// error if they disagree.
func (t *SentinelTopology) MasterAddr(ctx context.Context) (string, error) {
	addr := ""
	for _, s := range t.Sentinels {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		v, err := c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", t.MasterName).StringSlice()
		c.Close()
		if err != nil || len(v) != 2 {
			return "", fmt.Errorf("sentinel %s: get-master-addr-by-name: %v %v", s.Addr(), v, err)
		}
		a := net.JoinHostPort(v[0], v[1])
		if addr != "" && a != addr {
			return "", fmt.Errorf("sentinels disagree on the master: %s and %s", addr, a)
		}
		addr = a
	}
	return addr, nil
}

// Master is the data node that is the master now.
func (t *SentinelTopology) Master(ctx context.Context) (*RedisProc, error) {
	addr, err := t.MasterAddr(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range t.Nodes {
		if n.Addr() == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("master %s is not one of the nodes", addr)
}

// Replica is the data node that is not the master.
func (t *SentinelTopology) Replica(ctx context.Context) (*RedisProc, error) {
	m, err := t.Master(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range t.Nodes {
		if n != m {
			return n, nil
		}
	}
	return nil, errors.New("no replica node")
}

// WaitStable waits until every sentinel agrees on the master, the master
// has its replica online, and every sentinel sees that replica as healthy,
// so that a next failover can promote it.
func (t *SentinelTopology) WaitStable(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		last = t.stable()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("sentinel topology not stable after %s: %w", timeout, last)
}

func (t *SentinelTopology) stable() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := t.Master(ctx)
	if err != nil {
		return err
	}
	if err := WaitOnlineReplicas(m.Addr(), 1, 0); err != nil {
		return err
	}
	for _, s := range t.Sentinels {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		v, err := c.Do(ctx, "SENTINEL", "REPLICAS", t.MasterName).Slice()
		c.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: replicas: %w", s.Addr(), err)
		}
		good := 0
		for _, r := range v {
			f := fields(r)
			if f["flags"] == "slave" && f["master-link-status"] == "ok" {
				good++
			}
		}
		if good < 1 {
			return fmt.Errorf("sentinel %s sees no healthy replica: %v", s.Addr(), v)
		}
	}
	return t.masterFlagsOK(ctx)
}

// fields turns a sentinel reply (a flat list or a RESP3 map) into a map.
func fields(v any) map[string]string {
	out := map[string]string{}
	switch r := v.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			out[fmt.Sprint(r[i])] = fmt.Sprint(r[i+1])
		}
	case map[any]any:
		for k, x := range r {
			out[fmt.Sprint(k)] = fmt.Sprint(x)
		}
	}
	return out
}

// stableMaster waits until the topology is stable and returns its master.
func (t *SentinelTopology) stableMaster(ctx context.Context) (*RedisProc, error) {
	if err := t.WaitStable(deadlineLeft(ctx)); err != nil {
		return nil, err
	}
	return t.Master(ctx)
}

// Failover waits until the topology is stable, forces a failover with
// SENTINEL FAILOVER, and waits until the replica is the master and the old
// master follows it. It returns the new master.
func (t *SentinelTopology) Failover(timeout time.Duration) (*RedisProc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	old, err := t.stableMaster(ctx)
	if err != nil {
		return nil, err
	}
	// A sentinel refuses while it does not yet see a promotable replica
	// (NOGOODSLAVE) or another failover is in progress (INPROG): retry.
	for {
		_, err = t.sentinelDo(ctx, "SENTINEL", "FAILOVER", t.MasterName)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("SENTINEL FAILOVER: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return t.waitNewMaster(ctx, old, deadlineLeft(ctx))
}

// KillMaster waits until the topology is stable, kill -9s the master, waits
// until the sentinels promote the replica, and restarts the old master as
// a replica of the new one. It returns the new master.
func (t *SentinelTopology) KillMaster(timeout time.Duration) (*RedisProc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	old, err := t.stableMaster(ctx)
	if err != nil {
		return nil, err
	}
	old.Kill()
	var nm *RedisProc
	for {
		if m, err := t.Master(ctx); err == nil && m != old {
			nm = m
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no new master after killing %s", old.Addr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Restart it empty and already following the new master, as an
	// operator's restart would once Sentinel has reconfigured it; started
	// as a master it would serve its empty data set until Sentinel
	// converts it.
	old.Args = replicaArgs(old.Args, nm.Port)
	if err := old.Start(); err != nil {
		return nil, err
	}
	return t.waitNewMaster(ctx, old, deadlineLeft(ctx))
}

func replicaArgs(args []string, masterPort int) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--replicaof" {
			i += 2
			continue
		}
		out = append(out, args[i])
	}
	return append(out, "--replicaof", "127.0.0.1", strconv.Itoa(masterPort))
}

func (t *SentinelTopology) waitNewMaster(ctx context.Context, old *RedisProc, timeout time.Duration) (*RedisProc, error) {
	for {
		if m, err := t.Master(ctx); err == nil && m != old {
			demote(ctx, old, m)
			if err := WaitOnlineReplicas(m.Addr(), 1, deadlineLeft(ctx)); err != nil {
				return nil, err
			}
			return m, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no new master within %s", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// demote makes n a replica of m if n still claims the master role.
// Sentinel converts a demoted master that does only after failover-timeout
// and 8 s of its INFO polls; do it now, as it would. Until then the new
// master has no replica, and a beatd that waits for one publishes nothing.
func demote(ctx context.Context, n, m *RedisProc) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	defer c.Close()
	if info, err := c.Info(ctx, "replication").Result(); err == nil && strings.Contains(info, "role:master") {
		_ = c.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(m.Port)).Err()
	}
}

// Heal waits until every sentinel agrees on the master and none is failing
// it over, demotes the other data node if it still claims the role, and
// waits until the master has its replica online. It returns the master.
//
// The failovers of Failover and KillMaster heal themselves; Heal is for
// one the sentinels start on their own. After a switch a sentinel must
// hear from the new master within down-after-milliseconds (1 s here), and
// on a loaded machine it may not: it then fails over a master that is up,
// which stays a master beside the new one for seconds.
func (t *SentinelTopology) Heal(timeout time.Duration) (*RedisProc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		m, err := t.Master(ctx)
		if err == nil {
			err = t.masterFlagsOK(ctx)
		}
		if err == nil {
			for _, n := range t.Nodes {
				if n != m && n.Running() {
					demote(ctx, n, m)
				}
			}
			if err = WaitOnlineReplicas(m.Addr(), 1, 0); err == nil {
				return m, nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("sentinel topology not healed after %s: %w", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// masterFlagsOK is an error unless every sentinel reports the master with
// no down or failover flag.
func (t *SentinelTopology) masterFlagsOK(ctx context.Context) error {
	for _, s := range t.Sentinels {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		v, err := c.Do(ctx, "SENTINEL", "MASTER", t.MasterName).Result()
		c.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: master: %w", s.Addr(), err)
		}
		if f := fields(v); f["flags"] != "master" {
			return fmt.Errorf("sentinel %s: master flags %q", s.Addr(), f["flags"])
		}
	}
	return nil
}

func deadlineLeft(ctx context.Context) time.Duration {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Minute
	}
	return max(time.Until(d), 0)
}
