package amqp

import (
	"errors"
	"fmt"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// lockName is the exclusive queue that is a shard's fence lock
// (shard "": the unsharded cluster's).
func lockName(cluster, shard string) string {
	if shard != "" {
		shard = "." + shard
	}
	return "beatd.fence." + cluster + shard
}

// CheckShardLocksFree takes and releases the fence lock of every shard of
// each count in counts (1: the unsharded lock), and fails naming the
// first one a connection still holds. A resize calls it while every
// replica is stopped: an entry that moves changes lock, so a replica of
// the old count that was paused through the resize, its connection still
// open, could otherwise publish a moved entry's slot under its old lock
// when it wakes. A lock that is free has no connection left holding it,
// and a woken replica that reconnects checks its term in etcd (Verify),
// where its election key is gone.
func CheckShardLocksFree(url, password, cluster string, counts []int) error {
	urls, err := ParseAMQPURLs(url, password)
	if err != nil {
		return err
	}
	var conn *amqp.Connection
	var errs []error
	for _, u := range urls {
		if conn, err = u.Dial("beatd resize "+cluster, 0); err == nil {
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
	}
	if conn == nil {
		return fmt.Errorf("amqp: connect to RabbitMQ: %w", errors.Join(errs...))
	}
	defer conn.Close() // releases every lock taken here
	seen := map[string]bool{}
	for _, n := range counts {
		for i := range n {
			shard := ""
			if n > 1 {
				shard = strconv.Itoa(i)
			}
			name := lockName(cluster, shard)
			if seen[name] {
				continue
			}
			seen[name] = true
			ch, err := conn.Channel()
			if err != nil {
				return fmt.Errorf("amqp: open channel: %w", err)
			}
			_, err = ch.QueueDeclare(name, false, false, true, false, nil)
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
				return fmt.Errorf("amqp: the fence lock %s is held by a connection: a replica of the old count still runs (paused or cut off); once RabbitMQ's heartbeat timeout closes its connection, rerun", name)
			}
			if err != nil {
				return fmt.Errorf("amqp: take the fence lock %s: %w", name, err)
			}
			_ = ch.Close()
		}
	}
	return nil
}
