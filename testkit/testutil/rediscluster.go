package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/beatd/beatd/testkit/harness"
)

// RedisCluster is a Redis Cluster of masters without replicas, created
// with redis-cli --cluster create on loopback.
type RedisCluster struct {
	Nodes []*harness.RedisProc
}

// StartRedisCluster starts n cluster-enabled redis-servers under dir and
// joins them; it returns once the cluster is ok.
func StartRedisCluster(dir string, n int) (*RedisCluster, error) {
	c := &RedisCluster{}
	var addrs []string
	for i := 0; i < n; i++ {
		port, err := harness.FreePort()
		if err != nil {
			c.Stop()
			return nil, err
		}
		d := filepath.Join(dir, fmt.Sprintf("cluster%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			c.Stop()
			return nil, err
		}
		p := &harness.RedisProc{Bin: "redis-server", Port: port, Dir: d, Args: []string{"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(d, "nodes.conf"), "--cluster-node-timeout", "2000"}}
		if err := p.Start(); err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, p)
		addrs = append(addrs, p.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Every node must agree, not just the one that ran the create.
		ok, out := true, []byte(nil)
		for _, n := range c.Nodes {
			var err error
			out, err = exec.Command("redis-cli", "-p", strconv.Itoa(n.Port), "cluster", "info").CombinedOutput()
			if err != nil || !containsLine(string(out), "cluster_state:ok") {
				ok = false
				break
			}
		}
		if ok {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("redis cluster not ok: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Addrs are the nodes' addresses.
func (c *RedisCluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Addr())
	}
	return out
}

// Stop kills every node.
func (c *RedisCluster) Stop() {
	for _, n := range c.Nodes {
		n.Kill()
	}
}

func containsLine(s, line string) bool {
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		l := s[:i]
		if len(l) > 0 && l[len(l)-1] == '\r' {
			l = l[:len(l)-1]
		}
		if l == line {
			return true
		}
		if i == len(s) {
			break
		}
		s = s[i+1:]
	}
	return false
}
