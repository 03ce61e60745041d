// Package etcdscan is beatd's one way to read a whole key prefix from
// etcd: in pages, every page at the first page's revision, so a million
// keys are never one giant response and what is read is one snapshot.
package etcdscan

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Prefix calls fn with every key under prefix, in key order, reading
// pages of page keys, and returns the revision they were read at.
func Prefix(ctx context.Context, kv clientv3.KV, prefix string, page int64, fn func(*mvccpb.KeyValue)) (int64, error) {
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(page),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := kv.Get(ctx, from, opts...)
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			// A response's header carries etcd's current revision, not the
			// one asked for: later pages keep the first's.
			rev = resp.Header.Revision
		}
		for _, r := range resp.Kvs {
			fn(r)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
