package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/embedetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// MustStartEmbeddedEtcd runs an in-process single-node etcd for the test.
func MustStartEmbeddedEtcd(tb testing.TB) *embedetcd.Server {
	tb.Helper()
	s, err := embedetcd.Start(embedetcd.Config{Dir: tb.TempDir(), ClientPort: FreePort(tb), PeerPort: FreePort(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// NewEtcdClient returns a client on endpoints, closed when the test ends.
func NewEtcdClient(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// EtcdMember is one process of an EtcdCluster.
type EtcdMember struct {
	Name       string
	ClientPort int
	PeerPort   int
	Dir        string
	cmd        *exec.Cmd
	args       []string
	log        *os.File
}

// ClientURL is the member's client endpoint.
func (m *EtcdMember) ClientURL() string { return fmt.Sprintf("http://127.0.0.1:%d", m.ClientPort) }

// Running reports whether the member's process is up.
func (m *EtcdMember) Running() bool { return m.cmd != nil }

// EtcdCluster is a cluster of Debian's etcd binary on loopback.
type EtcdCluster struct {
	tb      testing.TB
	Members []*EtcdMember
}

// MustStartEtcdCluster starts n members of the etcd binary on free ports.
func MustStartEtcdCluster(tb testing.TB, n int) *EtcdCluster {
	tb.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		tb.Fatal("etcd not on PATH: apt-get install -y etcd-server")
	}
	c := &EtcdCluster{tb: tb}
	var initial []string
	for i := 0; i < n; i++ {
		m := &EtcdMember{Name: fmt.Sprintf("m%d", i), ClientPort: FreePort(tb), PeerPort: FreePort(tb), Dir: tb.TempDir()}
		initial = append(initial, fmt.Sprintf("%s=http://127.0.0.1:%d", m.Name, m.PeerPort))
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.args = []string{"--name", m.Name, "--data-dir", filepath.Join(m.Dir, "data"),
			"--listen-client-urls", m.ClientURL(), "--advertise-client-urls", m.ClientURL(),
			"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", m.PeerPort),
			"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", m.PeerPort),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "beatd-test", "--heartbeat-interval", "50", "--election-timeout", "500",
			"--logger", "zap", "--log-level", "warn"}
		c.Start(m)
	}
	tb.Cleanup(func() {
		for _, m := range c.Members {
			c.Kill(m)
		}
	})
	c.WaitHealthy(30 * time.Second)
	return c
}

// Endpoints lists every member's client URL.
func (c *EtcdCluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL())
	}
	return out
}

// Start (re)starts a member on its data directory.
func (c *EtcdCluster) Start(m *EtcdMember) {
	c.tb.Helper()
	if m.cmd != nil {
		return
	}
	if m.log == nil {
		m.log, _ = os.Create(filepath.Join(m.Dir, "etcd.log"))
	}
	cmd := exec.Command("etcd", m.args...)
	cmd.Stdout, cmd.Stderr = m.log, m.log
	if err := cmd.Start(); err != nil {
		c.tb.Fatal(err)
	}
	m.cmd = cmd
}

// Kill SIGKILLs a member.
func (c *EtcdCluster) Kill(m *EtcdMember) {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	m.cmd = nil
}

// RaftLeader returns the member that is raft leader.
func (c *EtcdCluster) RaftLeader(ctx context.Context) (*EtcdMember, error) {
	for _, m := range c.Members {
		if m.cmd == nil {
			continue
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL()}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(sctx, m.ClientURL())
		cancel()
		cli.Close()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no raft leader")
}

// WaitHealthy waits until a raft leader exists and a write commits.
func (c *EtcdCluster) WaitHealthy(timeout time.Duration) {
	c.tb.Helper()
	var eps []string
	for _, m := range c.Members {
		if m.cmd != nil {
			eps = append(eps, m.ClientURL())
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.tb.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Put(ctx, "/health-probe", "1")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("etcd cluster not healthy after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
