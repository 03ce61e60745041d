package store

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/beatd/beatd/internal/keys"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Compact compacts etcd's history every period, to the revision it saw
// one period earlier, until ctx ends. beatd rewrites its state buckets
// every few seconds; without compaction their old revisions fill the
// backend quota, and etcd then refuses every write. Compaction is
// cluster-wide, so only the leader runs this, and only when asked
// (--etcd-compact): on an etcd shared with others, the operator's
// --auto-compaction-retention is the right tool.
//
// The period is kept on s's clock.
func (s *Store) Compact(ctx context.Context, period time.Duration, log *slog.Logger) {
	cli := s.cli
	var prev int64
	t := s.clock.NewTicker(period)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.Get(rctx, keys.CompactionProbe, clientv3.WithCountOnly())
		if err == nil && prev > 0 {
			_, err = cli.Compact(rctx, prev)
			if errors.Is(err, rpctypes.ErrCompacted) {
				err = nil // someone else compacted past it already
			}
			if err == nil {
				log.Debug("etcd history compacted", "revision", prev)
			}
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("etcd compaction failed; retrying next period", "err", err, "period", period.String())
		}
		if err == nil {
			prev = resp.Header.Revision
		}
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}
