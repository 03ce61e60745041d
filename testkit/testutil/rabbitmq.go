package testutil

import (
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	amqp "github.com/rabbitmq/amqp091-go"
)

// MustStartRabbitMQ starts a rabbitmq-server of its own (node name, ports,
// epmd, data dir) and stops it when tb ends. It takes seconds: start one
// per package, from TestMain or a sync.Once.
func MustStartRabbitMQ(tb testing.TB, dir string) *harness.Rabbit {
	tb.Helper()
	r, err := harness.StartRabbit(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

// DialRabbit opens a connection to r, closed when tb ends.
func DialRabbit(tb testing.TB, r *harness.Rabbit) *amqp.Connection {
	tb.Helper()
	c, err := amqp.DialConfig(r.URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}
