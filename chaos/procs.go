package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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

// ClientAddr is the member's client host:port.
func (m *EtcdMember) ClientAddr() string { return "127.0.0.1:" + strconv.Itoa(m.ClientPort) }

// Running reports whether the member's process is up.
func (m *EtcdMember) Running() bool { return m.cmd != nil }

// EtcdCluster is a cluster of the etcd binary on loopback ports.
type EtcdCluster struct {
	Members []*EtcdMember
}

// StartEtcdCluster starts n members of the etcd binary on PATH, with data
// under dir, and waits until the cluster commits writes.
func StartEtcdCluster(dir string, n int) (*EtcdCluster, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, errors.New("etcd not on PATH (Debian: apt-get install -y etcd-server)")
	}
	c := &EtcdCluster{}
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
		m.args = []string{"--name", m.Name, "--data-dir", filepath.Join(m.Dir, "data"),
			"--listen-client-urls", m.ClientURL(), "--advertise-client-urls", m.ClientURL(),
			"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", m.PeerPort),
			"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", m.PeerPort),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "beatd-drill", "--heartbeat-interval", "50", "--election-timeout", "500",
			"--logger", "zap", "--log-level", "warn"}
		if err := c.Start(m); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
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
	if m.cmd != nil {
		return nil
	}
	if m.log == nil {
		f, err := os.OpenFile(filepath.Join(m.Dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		m.log = f
	}
	cmd := exec.Command("etcd", m.args...)
	cmd.Stdout, cmd.Stderr = m.log, m.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd %s: %w", m.Name, err)
	}
	m.cmd = cmd
	return nil
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

// Stop kills every member.
func (c *EtcdCluster) Stop() {
	for _, m := range c.Members {
		c.Kill(m)
		if m.log != nil {
			m.log.Close()
			m.log = nil
		}
	}
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
	return nil, errors.New("no raft leader")
}

// WaitHealthy waits until a write commits on the running members.
func (c *EtcdCluster) WaitHealthy(timeout time.Duration) error {
	var eps []string
	for _, m := range c.Members {
		if m.cmd != nil {
			eps = append(eps, m.ClientURL())
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Put(ctx, "/health-probe", "1")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd cluster not healthy after %s: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RedisServer is a redis-server process with AOF on, fsync always, so a
// kill loses no acknowledged dedup key or fence.
type RedisServer struct {
	Port int
	Dir  string
	cmd  *exec.Cmd
	log  *os.File
}

// StartRedis starts redis-server on a free port with data in dir.
func StartRedis(dir string) (*RedisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server not on PATH (Debian: apt-get install -y redis-server)")
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	r := &RedisServer{Port: port, Dir: dir}
	return r, r.Start()
}

// Addr is host:port.
func (r *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.Port) }

// Start (re)starts the server and waits for PING.
func (r *RedisServer) Start() error {
	if r.cmd != nil {
		return nil
	}
	if r.log == nil {
		f, err := os.OpenFile(filepath.Join(r.Dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		r.log = f
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.Dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always")
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server did not start: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill SIGKILLs the server.
func (r *RedisServer) Kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Replica is one beatd process.
type Replica struct {
	ID       string
	HTTPPort int
	Args     []string
	LogPath  string
	cmd      *exec.Cmd
	exited   chan struct{}
	// Proxies carry its traffic, so a partition can cut it off.
	EtcdProxies []*Proxy
	RedisProxy  *Proxy
}

// Start launches the replica, appending to its log.
func (r *Replica) Start(bin string) error {
	f, err := os.OpenFile(r.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, r.Args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start replica %s: %w", r.ID, err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(r.exited)
	}()
	return nil
}

// Running reports whether the process is up.
func (r *Replica) Running() bool {
	if r.cmd == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process.
func (r *Replica) Signal(sig syscall.Signal) {
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(sig)
	}
}

// Wait waits up to timeout for the process to exit.
func (r *Replica) Wait(timeout time.Duration) bool {
	if r.cmd == nil {
		return true
	}
	select {
	case <-r.exited:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Kill SIGKILLs the process (waking it first if stopped).
func (r *Replica) Kill() {
	if !r.Running() {
		return
	}
	r.Signal(syscall.SIGCONT)
	r.Signal(syscall.SIGKILL)
	<-r.exited
}
