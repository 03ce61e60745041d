package testutil

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/testkit/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// MustStartEmbeddedEtcd runs an in-process single-node etcd for the test.
func MustStartEmbeddedEtcd(tb testing.TB) *embedetcd.Server {
	tb.Helper()
	// A free port is free only when FreePort looked: a test running in
	// parallel can bind it first. Another pair of ports then does.
	for attempt := 1; ; attempt++ {
		s, err := embedetcd.Start(embedetcd.Config{Dir: tb.TempDir(), ClientPort: FreePort(tb), PeerPort: FreePort(tb)})
		if err != nil && errors.Is(err, syscall.EADDRINUSE) && attempt < 5 {
			continue
		}
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(s.Close)
		return s
	}
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

// EtcdCluster is a harness.EtcdCluster owned by a test: failures to start
// fail the test, and it is stopped when the test ends.
type EtcdCluster struct {
	*harness.EtcdCluster
	tb testing.TB
}

// MustStartEtcdCluster starts n members of the etcd binary on free ports,
// with the fast raft timings of harness.EtcdFast.
func MustStartEtcdCluster(tb testing.TB, n int) *EtcdCluster {
	tb.Helper()
	c, err := harness.StartEtcdCluster(tb.TempDir(), n, nil, harness.EtcdFast...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return &EtcdCluster{EtcdCluster: c, tb: tb}
}

// Start restarts a member.
func (c *EtcdCluster) Start(m *harness.EtcdMember) {
	c.tb.Helper()
	if err := c.EtcdCluster.Start(m); err != nil {
		c.tb.Fatal(err)
	}
}

// WaitHealthy waits until the running members commit a write.
func (c *EtcdCluster) WaitHealthy(timeout time.Duration) {
	c.tb.Helper()
	if err := c.EtcdCluster.WaitHealthy(timeout); err != nil {
		c.tb.Fatal(err)
	}
}
