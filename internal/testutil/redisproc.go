package testutil

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/redis/go-redis/v9"
)

// RedisProc is a redis-server or redis-sentinel process not tied to one
// test (chaos.RedisProc).
type RedisProc = chaos.RedisProc

// SentinelTopology is a master, a replica and three sentinels
// (chaos.SentinelTopology); start it once per package.
type SentinelTopology = chaos.SentinelTopology

// StartSentinelTopology starts a topology under dir.
func StartSentinelTopology(dir string) (*SentinelTopology, error) {
	return chaos.StartSentinelTopology(dir)
}

// WaitOnlineReplicas waits until addr is a master with n online replicas.
func WaitOnlineReplicas(addr string, n int, timeout time.Duration) error {
	return chaos.WaitOnlineReplicas(addr, n, timeout)
}

// FreePortNoTB is FreePort for code that runs outside a test (TestMain).
func FreePortNoTB() (int, error) { return chaos.FreePort() }

// MustStartReplica starts a redis-server replicating from master and
// waits until the master counts it as an online replica. It is stopped
// when the test ends.
func MustStartReplica(tb testing.TB, master string) *RedisProc {
	tb.Helper()
	host, port, _ := net.SplitHostPort(master)
	// The master would wait 5 s for more replicas before a full sync.
	mc := redis.NewClient(&redis.Options{Addr: master})
	err := mc.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err()
	mc.Close()
	if err != nil {
		tb.Fatal(err)
	}
	p := &RedisProc{Bin: "redis-server", Port: FreePort(tb), Dir: tb.TempDir()}
	p.Args = []string{"--port", strconv.Itoa(p.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--replicaof", host, port}
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Kill)
	if err := WaitOnlineReplicas(master, 1, 15*time.Second); err != nil {
		tb.Fatal(err)
	}
	return p
}
