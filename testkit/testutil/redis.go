package testutil

import (
	"testing"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/redis/go-redis/v9"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	p, err := harness.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// Redis is a harness.RedisProc owned by one test: a failure to start
// fails the test, and it is killed when the test ends.
type Redis struct {
	*harness.RedisProc
	tb testing.TB
	// AOF, read by Start, fsyncs every write (see harness.RedisArgs).
	AOF bool
}

// Client returns a client on database 0, closed when the test ends.
func (r *Redis) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	r.tb.Cleanup(func() { c.Close() })
	return c
}

// ClientDB returns a client on database db, closed when the test ends.
func (r *Redis) ClientDB(db int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), DB: db})
	r.tb.Cleanup(func() { c.Close() })
	return c
}

// MustStartRedis starts redis-server on a free port with AOF on, and stops
// it when the test ends.
func MustStartRedis(tb testing.TB) *Redis {
	tb.Helper()
	p, err := harness.NewRedis(tb.TempDir(), true)
	if err != nil {
		tb.Fatal(err)
	}
	r := &Redis{RedisProc: p, tb: tb, AOF: true}
	r.Start()
	tb.Cleanup(r.Stop)
	return r
}

// Start (re)starts the server on the same port and data directory.
func (r *Redis) Start() {
	r.tb.Helper()
	r.Args = harness.RedisArgs(r.Port, r.Dir, r.AOF)
	if err := r.RedisProc.Start(); err != nil {
		r.tb.Fatal(err)
	}
}

// Stop kills the server (SIGKILL: like a crash; AOF with fsync always
// keeps every acknowledged write).
func (r *Redis) Stop() { r.Kill() }
