package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/beatd/beatd/broker"
	"github.com/redis/go-redis/v9"
)

// RaiseShardFences raises the fence of every shard of each count in
// counts (1: the unsharded fence) to at least floor, as a new leader
// raises its own (RaiseFence); a fence already higher is left. A resize
// calls it while every replica is stopped, so that no replica of the old
// count can publish once it wakes (reshard.Options.RaiseFences).
func RaiseShardFences(ctx context.Context, rdb redis.UniversalClient, keyPrefix string, counts []int, floor int64) error {
	seen := map[string]bool{}
	for _, n := range counts {
		for i := range n {
			shard := ""
			if n > 1 {
				shard = strconv.Itoa(i)
			}
			if seen[shard] {
				continue
			}
			seen[shard] = true
			err := New(rdb, Options{KeyPrefix: keyPrefix, Shard: shard}).RaiseFence(ctx, floor)
			if err != nil && !errors.Is(err, broker.ErrStale) {
				return fmt.Errorf("redis: raise the fence of shard %q: %w", shard, err)
			}
		}
	}
	return nil
}
