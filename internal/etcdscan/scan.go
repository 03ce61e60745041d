// Package etcdscan is beatd's one way to read many keys from etcd: a
// whole key prefix in pages, and many small prefixes in batched
// transactions, every read at the first one's revision, so a million keys
// are never one giant response and what is read is one snapshot.
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

// ReadBatch is how many reads one read-only transaction holds (Prefixes',
// and the gets of named keys elsewhere): reads need no atomicity, so a batch small enough for any etcd's
// --max-txn-ops serves every cluster without knowing its limit.
const ReadBatch = 16

// Prefixes reads the keys under each of prefixes, each a small range (an
// election's candidates, say): read-only transactions of ReadBatch
// ranges, every one at the first's revision, so what is read is one
// snapshot, and the keys between the prefixes (a shard's state table and
// definitions, beside its election) are never read. It calls fn with
// each prefix's index and keys, and returns the revision read. opts are
// added to every range (clientv3.WithKeysOnly, WithLimit).
func Prefixes(ctx context.Context, kv clientv3.KV, prefixes []string, fn func(i int, kvs []*mvccpb.KeyValue), opts ...clientv3.OpOption) (int64, error) {
	var rev int64
	for done := 0; done < len(prefixes); {
		n := min(len(prefixes)-done, ReadBatch)
		ops := make([]clientv3.Op, n)
		for j, p := range prefixes[done : done+n] {
			o := append([]clientv3.OpOption{clientv3.WithPrefix()}, opts...)
			if rev > 0 {
				o = append(o, clientv3.WithRev(rev))
			}
			ops[j] = clientv3.OpGet(p, o...)
		}
		resp, err := kv.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for j, r := range resp.Responses {
			fn(done+j, r.GetResponseRange().GetKvs())
		}
		done += n
	}
	return rev, nil
}
