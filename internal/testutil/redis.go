package testutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Redis is a redis-server owned by one test.
type Redis struct {
	tb   testing.TB
	Port int
	Dir  string
	cmd  *exec.Cmd
	AOF  bool
}

// Addr is host:port.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.Port) }

// URL is a Celery broker URL for database db.
func (r *Redis) URL(db int) string { return fmt.Sprintf("redis://%s/%d", r.Addr(), db) }

// Client returns a client on database 0, closed when the test ends.
func (r *Redis) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	r.tb.Cleanup(func() { c.Close() })
	return c
}

// MustStartRedis starts redis-server on a free port with AOF on, and stops
// it when the test ends.
func MustStartRedis(tb testing.TB) *Redis {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatal("redis-server not on PATH: apt-get install -y redis-server")
	}
	r := &Redis{tb: tb, Dir: tb.TempDir(), AOF: true}
	r.Port = FreePort(tb)
	r.Start()
	tb.Cleanup(r.Stop)
	return r
}

// Start (re)starts the server on the same port and data directory.
func (r *Redis) Start() {
	r.tb.Helper()
	args := []string{"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.Dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "yes"}
	if r.AOF {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, _ = os.Create(filepath.Join(r.Dir, "redis.log"))
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		r.tb.Fatal(err)
	}
	r.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			r.tb.Fatalf("redis-server on %s did not start: %v", r.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL: like a crash; AOF with fsync always
// keeps every acknowledged write).
func (r *Redis) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}
