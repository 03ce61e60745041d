package status

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/store"
)

// stateTables reads the entries' state from every shard's table.
type stateTables []*store.Store

// shardTables returns the cluster's state tables (the one of an unsharded
// cluster, else one a shard) and, for a sharded cluster, fills out.Shards
// with each shard's leader.
func shardTables(ctx context.Context, cli *clientv3.Client, prefix string, out *View) (stateTables, error) {
	n, err := shardCount(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	tables := make(stateTables, n)
	for i := range n {
		tables[i] = store.New(cli, keys.Shard(prefix, i, n))
	}
	if n > 1 {
		if out.Shards, err = observeShards(ctx, cli, prefix, n); err != nil {
			return nil, err
		}
	}
	return tables, nil
}

// Shards is who leads each shard of the cluster at prefix, by shard, as
// /status's shards says; nil for a cluster of one shard.
func Shards(ctx context.Context, cli *clientv3.Client, prefix string) ([]ShardStatus, error) {
	n, err := shardCount(ctx, cli, prefix)
	if err != nil || n == 1 {
		return nil, err
	}
	return observeShards(ctx, cli, prefix, n)
}

// shardCount is the cluster's shard count (1 without a recorded one).
func shardCount(ctx context.Context, cli *clientv3.Client, prefix string) (int, error) {
	resp, err := cli.Get(ctx, keys.ShardCount(prefix))
	if err != nil {
		return 0, fmt.Errorf("status: read the shard count: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 1, nil
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("status: the shard count at %s is %q, not a count", keys.ShardCount(prefix), resp.Kvs[0].Value)
	}
	return n, nil
}

// observeShards reads each of n shards' election.
func observeShards(ctx context.Context, cli *clientv3.Client, prefix string, n int) ([]ShardStatus, error) {
	out := make([]ShardStatus, 0, n)
	for i := range n {
		l, err := election.Observe(ctx, cli, keys.Shard(prefix, i, n))
		if err != nil && !errors.Is(err, election.ErrNoLeader) {
			return nil, err
		}
		out = append(out, ShardStatus{Shard: i, LeaderID: l.ID, FencingToken: l.Token})
	}
	return out, nil
}

// all is every stored state.
func (t stateTables) all(ctx context.Context) (map[string]*store.EntryState, error) {
	out := map[string]*store.EntryState{}
	for _, s := range t {
		table, err := s.Load(ctx)
		if err != nil {
			return nil, err
		}
		if len(t) == 1 {
			return table.States(), nil
		}
		maps.Copy(out, table.States())
	}
	return out, nil
}

// of is the stored state of the entries named, each read from its shard.
func (t stateTables) of(ctx context.Context, names []string) (map[string]*store.EntryState, error) {
	if len(t) == 1 {
		return t[0].StatesOf(ctx, names)
	}
	byShard := make([][]string, len(t))
	for _, name := range names {
		i := keys.ShardOf(name, len(t))
		byShard[i] = append(byShard[i], name)
	}
	out := map[string]*store.EntryState{}
	for i, names := range byShard {
		if len(names) == 0 {
			continue
		}
		states, err := t[i].StatesOf(ctx, names)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, states)
	}
	return out, nil
}
