package publisher

import (
	"context"
	"errors"
	"fmt"

	"github.com/beatd/beatd/election"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LeaderCheck returns AMQPOptions.Verify for the election under prefix:
// token is current while the oldest leader key was created at revision
// token. The read is linearizable (etcd's default), so it sees every term
// elected before it began.
func LeaderCheck(cli *clientv3.Client, prefix string) func(ctx context.Context, token int64) error {
	return func(ctx context.Context, token int64) error {
		l, err := election.Observe(ctx, cli, prefix)
		if errors.Is(err, election.ErrNoLeader) {
			return fmt.Errorf("%w: term %d has no leader key any more", ErrStale, token)
		}
		if err != nil {
			return fmt.Errorf("publisher: check the term in etcd: %w", err)
		}
		if l.Token != token {
			return fmt.Errorf("%w: term %d, but %s leads with token %d", ErrStale, token, l.ID, l.Token)
		}
		return nil
	}
}
