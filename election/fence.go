package election

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fence is a term's proof of leadership: the leader key and its create
// revision, the fencing token. It is the one fence type: every guarded
// write in etcd (the state, the catalog) takes it, and the brokers take
// its Token.
type Fence struct {
	Key   string
	Token int64
}

// Held is the comparison an etcd transaction guards with: true while the
// leader key still exists with this token as its create revision, as
// concurrency.Election's IsOwner does. A deposed leader's writes fail it.
func (f Fence) Held() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Token)
}

// ErrDeposed means a term is not the current one any more.
var ErrDeposed = errors.New("election: term is not current")

// CheckCurrent reports whether token is the current term under prefix:
// the oldest leader key was created at revision token. The read is
// linearizable (etcd's default), so it sees every term elected before it
// began. A broker that cannot run a fence check itself (RabbitMQ) asks it
// on each new connection.
func CheckCurrent(ctx context.Context, cli *clientv3.Client, prefix string, token int64) error {
	l, err := Observe(ctx, cli, prefix)
	if errors.Is(err, ErrNoLeader) {
		return fmt.Errorf("%w: term %d has no leader key any more", ErrDeposed, token)
	}
	if err != nil {
		return fmt.Errorf("election: check the term in etcd: %w", err)
	}
	if l.Token != token {
		return fmt.Errorf("%w: term %d, but %s leads with token %d", ErrDeposed, token, l.ID, l.Token)
	}
	return nil
}
