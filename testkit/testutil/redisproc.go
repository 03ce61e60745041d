package testutil

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/redis/go-redis/v9"
)

// MustStartReplica starts a redis-server replicating from master and
// waits until the master counts it as an online replica. It is stopped
// when the test ends.
func MustStartReplica(tb testing.TB, master string) *harness.RedisProc {
	tb.Helper()
	host, port, _ := net.SplitHostPort(master)
	// The master would wait 5 s for more replicas before a full sync.
	mc := redis.NewClient(&redis.Options{Addr: master})
	err := mc.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err()
	mc.Close()
	if err != nil {
		tb.Fatal(err)
	}
	p, err := harness.NewRedis(tb.TempDir(), false)
	if err != nil {
		tb.Fatal(err)
	}
	p.Args = append(p.Args, "--replicaof", host, port)
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Kill)
	if err := harness.WaitOnlineReplicas(master, 1, 15*time.Second); err != nil {
		tb.Fatal(err)
	}
	return p
}
