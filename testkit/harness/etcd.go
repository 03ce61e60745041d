package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdMember is one process of an EtcdCluster.
type EtcdMember struct {
	Name       string
	ClientPort int
	PeerPort   int
	// Dir holds the member's log; its data is in DataDir.
	Dir  string
	args []string
	proc *Proc
}

// ClientURL is the member's client endpoint.
func (m *EtcdMember) ClientURL() string { return fmt.Sprintf("http://127.0.0.1:%d", m.ClientPort) }

// ClientAddr is the member's client host:port.
func (m *EtcdMember) ClientAddr() string { return "127.0.0.1:" + strconv.Itoa(m.ClientPort) }

// DataDir is the member's etcd data directory.
func (m *EtcdMember) DataDir() string { return filepath.Join(m.Dir, "data") }

// Running reports whether the member's process is up.
func (m *EtcdMember) Running() bool { return m.proc != nil }

// Proc is the member's running process (nil if not running).
func (m *EtcdMember) Proc() *Proc { return m.proc }

// EtcdCluster is a cluster of the etcd binary on loopback ports. Its
// methods are not safe for concurrent use.
type EtcdCluster struct {
	Members []*EtcdMember
	// Procs, when set, owns every member process started.
	Procs *Procs
}

// EtcdFast are the raft timings a test cluster runs with, so that a
// leader is elected and a failover is over within about a second.
var EtcdFast = []string{"--heartbeat-interval", "50", "--election-timeout", "500"}

// StartEtcdCluster starts n members of the etcd binary on PATH, member i
// under dir/etcd<i>, each with args appended to its own (EtcdFast, say),
// and waits until the cluster commits writes. ps, if not nil, owns the
// processes.
func StartEtcdCluster(dir string, n int, ps *Procs, args ...string) (*EtcdCluster, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, errors.New("etcd not on PATH (Debian: apt-get install -y etcd-server)")
	}
	// FreePort's port can be taken by another test before etcd binds it;
	// the member then exits, and so may the cluster's bootstrap. That
	// start is retried once, on new ports and a fresh directory.
	c, err := startEtcdCluster(filepath.Join(dir, "try1"), n, ps, args...)
	if errors.Is(err, errMemberExited) {
		c, err = startEtcdCluster(filepath.Join(dir, "try2"), n, ps, args...)
	}
	return c, err
}

// errMemberExited marks a cluster start that failed with a member gone.
var errMemberExited = errors.New("an etcd member exited while the cluster started")

func startEtcdCluster(dir string, n int, ps *Procs, args ...string) (*EtcdCluster, error) {
	c := &EtcdCluster{Procs: ps}
	var initial []string
	for i := 0; i < n; i++ {
		cp, err := FreePort()
		if err != nil {
			return nil, err
		}
		pp, err := FreePort()
		if err != nil {
			return nil, err
		}
		m := &EtcdMember{Name: fmt.Sprintf("m%d", i), ClientPort: cp, PeerPort: pp, Dir: filepath.Join(dir, fmt.Sprintf("etcd%d", i))}
		if err := os.MkdirAll(m.Dir, 0o700); err != nil {
			return nil, err
		}
		initial = append(initial, fmt.Sprintf("%s=http://127.0.0.1:%d", m.Name, m.PeerPort))
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.args = append([]string{"--name", m.Name, "--data-dir", m.DataDir(),
			"--listen-client-urls", m.ClientURL(), "--advertise-client-urls", m.ClientURL(),
			"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", m.PeerPort),
			"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", m.PeerPort),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "beatd-harness", "--logger", "zap", "--log-level", "warn"}, args...)
		if err := c.Start(m); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		var why []string
		exited := false
		for _, m := range c.Members {
			state := "running"
			if m.proc != nil && m.proc.Exited() {
				state, exited = fmt.Sprintf("exited (%v)", m.proc.ExitErr()), true
			}
			log, _ := os.ReadFile(filepath.Join(m.Dir, "etcd.log"))
			why = append(why, fmt.Sprintf("%s (client %d, peer %d) %s; log tail:\n%s", m.Name, m.ClientPort, m.PeerPort, state, tail(log, 1500)))
		}
		c.Stop()
		if exited {
			err = fmt.Errorf("%w: %w", errMemberExited, err)
		}
		return nil, fmt.Errorf("%w\n%s", err, strings.Join(why, "\n"))
	}
	return c, nil
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
func (c *EtcdCluster) Start(m *EtcdMember) error {
	if m.proc != nil {
		return nil
	}
	p, err := c.Procs.Start(Spec{Name: "etcd " + m.Name, Bin: "etcd", Args: m.args, LogPath: filepath.Join(m.Dir, "etcd.log")})
	if err != nil {
		return err
	}
	m.proc = p
	return nil
}

// Kill SIGKILLs a member.
func (c *EtcdCluster) Kill(m *EtcdMember) {
	if m.proc == nil {
		return
	}
	m.proc.Kill()
	m.proc = nil
}

// Stop kills every member.
func (c *EtcdCluster) Stop() {
	for _, m := range c.Members {
		c.Kill(m)
	}
}

// RaftLeader returns the member that is raft leader.
func (c *EtcdCluster) RaftLeader(ctx context.Context) (*EtcdMember, error) {
	for _, m := range c.Members {
		if m.proc == nil {
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
	return nil, errors.New("no raft leader")
}

// WaitHealthy waits until a write commits on the running members.
func (c *EtcdCluster) WaitHealthy(timeout time.Duration) error {
	var eps []string
	for _, m := range c.Members {
		if m.proc != nil {
			eps = append(eps, m.ClientURL())
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	err = Poll(context.Background(), timeout, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Put(ctx, "/health-probe", "1")
		return err
	})
	if err != nil {
		return fmt.Errorf("etcd cluster not healthy: %w", err)
	}
	return nil
}
