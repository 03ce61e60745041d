package chaos

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisProc is a redis-server or redis-sentinel process, shared by a drill
// or by a test package (started in TestMain or a sync.Once). Its arguments
// are redis.conf directives as command-line flags.
type RedisProc struct {
	Bin  string // redis-server or redis-sentinel
	Port int    // the port to probe for readiness (the TLS port for TLS-only servers)
	Dir  string
	Args []string
	// TLS, when set, is used to probe readiness.
	TLS *tls.Config
	// Username and Password probe readiness on a server with auth.
	Username, Password string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Addr is 127.0.0.1:Port.
func (p *RedisProc) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.Port) }

// Start starts the process and waits until it answers PING.
func (p *RedisProc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s on %s already running", p.Bin, p.Addr())
	}
	if _, err := exec.LookPath(p.Bin); err != nil {
		return fmt.Errorf("%s not on PATH: apt-get install -y redis-server redis-sentinel", p.Bin)
	}
	args := p.Args
	if p.Bin == "redis-sentinel" {
		// Sentinel rewrites its config file; it must have one of its own.
		conf := filepath.Join(p.Dir, "sentinel.conf")
		if _, err := os.Stat(conf); err != nil {
			if err := os.WriteFile(conf, nil, 0o644); err != nil {
				return err
			}
		}
		args = append([]string{conf}, args...)
	}
	logf, err := os.OpenFile(filepath.Join(p.Dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.Bin, args...)
	cmd.Dir = p.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a test that is killed does not leave it to
	// the terminal's signals, and Stop reaches only it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Bin, err)
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	p.cmd = cmd
	return p.waitReady(15 * time.Second)
}

func (p *RedisProc) waitReady(timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), TLSConfig: p.TLS, Username: p.Username, Password: p.Password,
		MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(p.Dir, "redis.log"))
			return fmt.Errorf("%s on %s did not start: %v\n%s", p.Bin, p.Addr(), err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill sends SIGKILL, like a crash, and waits until the port is closed.
func (p *RedisProc) Kill() { p.stop(syscall.SIGKILL) }

// Stop sends SIGTERM and waits until the port is closed.
func (p *RedisProc) Stop() { p.stop(syscall.SIGTERM) }

func (p *RedisProc) stop(sig syscall.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			break // reaped by the waiting goroutine
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", p.Addr(), 100*time.Millisecond)
		if err != nil {
			return
		}
		conn.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

// Running reports whether the process was started and not stopped.
func (p *RedisProc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Signal sends sig (SIGSTOP, SIGCONT) to the process.
func (p *RedisProc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s on %s not running", p.Bin, p.Addr())
	}
	return p.cmd.Process.Signal(sig)
}

// WaitOnlineReplicas waits until the server at addr is a master with at
// least n online replicas.
func WaitOnlineReplicas(addr string, n int, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	var last string
	for first := true; first || time.Now().Before(deadline); first = false {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "replication").Result()
		cancel()
		if err == nil {
			last = info
			if strings.Contains(info, "role:master") && strings.Count(info, "state=online") >= n {
				return nil
			}
		}
		if timeout > 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return fmt.Errorf("%s has fewer than %d online replicas after %s:\n%s", addr, n, timeout, last)
}
