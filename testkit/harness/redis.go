package harness

import (
	"context"
	"crypto/tls"
	"errors"
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

// RedisProc is a redis-server or redis-sentinel process. Its arguments
// are redis.conf directives as command-line flags. It can be stopped and
// started again on the same port and data directory.
type RedisProc struct {
	Bin  string // redis-server or redis-sentinel
	Port int    // the port to probe for readiness (the TLS port for TLS-only servers)
	Dir  string
	Args []string
	// TLS, when set, is used to probe readiness.
	TLS *tls.Config
	// Username and Password probe readiness on a server with auth.
	Username, Password string
	// Procs, when set, owns every process started.
	Procs *Procs

	mu   sync.Mutex
	proc *Proc
}

// RedisArgs are the arguments of a standalone redis-server on port with
// data in dir. With aof every acknowledged write is fsynced first, so a
// kill -9 loses none of them; without, nothing is persisted.
func RedisArgs(port int, dir string, aof bool) []string {
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "yes"}
	if aof {
		return append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	return append(args, "--appendonly", "no")
}

// NewRedis configures, without starting it, a standalone redis-server on a
// free port with data in dir (see RedisArgs).
func NewRedis(dir string, aof bool) (*RedisProc, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	return &RedisProc{Bin: "redis-server", Port: port, Dir: dir, Args: RedisArgs(port, dir, aof)}, nil
}

// StartRedis starts a standalone redis-server on a free port with data in
// dir (see RedisArgs) and waits until it answers PING.
func StartRedis(dir string, aof bool) (*RedisProc, error) {
	r, err := NewRedis(dir, aof)
	if err != nil {
		return nil, err
	}
	return r, r.Start()
}

// Addr is 127.0.0.1:Port.
func (p *RedisProc) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.Port) }

// URL is a Celery broker URL for database db.
func (p *RedisProc) URL(db int) string { return fmt.Sprintf("redis://%s/%d", p.Addr(), db) }

// Start starts the process and waits until it answers PING.
func (p *RedisProc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
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
	proc, err := p.Procs.Start(Spec{Name: p.Bin, Bin: p.Bin, Args: args, Dir: p.Dir, LogPath: filepath.Join(p.Dir, "redis.log")})
	if err != nil {
		return err
	}
	p.proc = proc
	return p.waitReady(15 * time.Second)
}

func (p *RedisProc) waitReady(timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), TLSConfig: p.TLS, Username: p.Username, Password: p.Password,
		MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	err := Poll(context.Background(), timeout, 20*time.Millisecond, func() error {
		if p.proc.Exited() {
			return fmt.Errorf("exited: %w", ErrGaveUp)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(p.Dir, "redis.log"))
		return fmt.Errorf("%s on %s did not start: %w\n%s", p.Bin, p.Addr(), err, log)
	}
	return nil
}

// Kill sends SIGKILL, like a crash, and waits until the port is closed.
func (p *RedisProc) Kill() { p.stop(true) }

// Stop sends SIGTERM and waits until the port is closed.
func (p *RedisProc) Stop() { p.stop(false) }

func (p *RedisProc) stop(kill bool) {
	p.mu.Lock()
	proc := p.proc
	p.proc = nil
	p.mu.Unlock()
	if proc == nil {
		return
	}
	if kill {
		proc.Kill()
	} else {
		proc.Stop(10 * time.Second)
	}
	// The process is reaped; wait out the kernel closing its socket.
	_ = Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() error {
		conn, err := net.DialTimeout("tcp", p.Addr(), 100*time.Millisecond)
		if err != nil {
			return nil
		}
		conn.Close()
		return errors.New("still listening")
	})
}

// Running reports whether the process was started and not stopped.
func (p *RedisProc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc != nil
}

// Pid is the process id of the running process (0 if not running).
func (p *RedisProc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return 0
	}
	return p.proc.Pid()
}

// Signal sends sig (SIGSTOP, SIGCONT) to the process.
func (p *RedisProc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return fmt.Errorf("%s on %s not running", p.Bin, p.Addr())
	}
	return p.proc.Signal(sig)
}

// WaitOnlineReplicas waits until the server at addr is a master with at
// least n online replicas. A timeout of 0 checks once.
func WaitOnlineReplicas(addr string, n int, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	var last string
	err := Poll(context.Background(), timeout, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		last = info
		if strings.Contains(info, "role:master") && strings.Count(info, "state=online") >= n {
			return nil
		}
		return errors.New("too few online replicas")
	})
	if err != nil {
		return fmt.Errorf("%s has fewer than %d online replicas after %s: %w\n%s", addr, n, timeout, err, last)
	}
	return nil
}
