package amqp

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/harness"
)

// One rabbitmq-server for the package, started by the first AMQP test
// (it takes seconds) and stopped by TestMain.
var (
	rabbitOnce sync.Once
	rabbit     *harness.Rabbit
	rabbitErr  error
	rabbitDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if rabbit != nil {
		rabbit.Close()
	}
	if rabbitDir != "" {
		os.RemoveAll(rabbitDir)
	}
	os.Exit(code)
}

func sharedRabbit(t *testing.T) *harness.Rabbit {
	t.Helper()
	rabbitOnce.Do(func() {
		rabbitDir, rabbitErr = os.MkdirTemp("", "beatd-rabbit-")
		if rabbitErr == nil {
			rabbit, rabbitErr = harness.StartRabbit(rabbitDir)
		}
	})
	if rabbitErr != nil {
		t.Fatal(rabbitErr)
	}
	return rabbit
}

// vhostSeq gives each test a fresh, empty virtual host would be ideal, but
// vhosts need rabbitmqctl; tests use unique queue names instead.
var nameSeq atomic.Int64

func uniq(prefix string) string { return fmt.Sprintf("%s%d", prefix, nameSeq.Add(1)) }

// termCheck is a leadership check standing in for etcd in the broker-side
// unit tests: the current term is whatever current holds.
type termCheck struct{ current atomic.Int64 }

func (c *termCheck) verify(_ context.Context, token int64) error {
	if cur := c.current.Load(); cur != token {
		return fmt.Errorf("%w: current term %d, not %d", broker.ErrStale, cur, token)
	}
	return nil
}

// fencedAMQP is an AMQP publisher of cluster on rb, declaring queues as
// cfg says, whose term 1 is current and fenced in; closed with the test.
func fencedAMQP(t *testing.T, rb *harness.Rabbit, cluster string, cfg *config.Config) *AMQP {
	t.Helper()
	var term termCheck
	term.current.Store(1)
	a, err := NewAMQP(AMQPOptions{URL: rb.URL(), Cluster: cluster, Verify: term.verify,
		Queues: func() Queues { return cfg.AMQP }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.RaiseFence(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	return a
}
