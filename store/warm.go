package store

import (
	"context"
	"fmt"

	"github.com/beatd/beatd/internal/etcdscan"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// bucketKV is one state bucket as etcd holds it.
type bucketKV struct {
	suffix string
	value  []byte
	rev    int64 // its ModRevision
}

// warmBuckets is the state table read ahead of a term (Warm): every
// bucket as etcd held it at rev.
type warmBuckets struct {
	rev     int64
	buckets map[string]bucketKV // by suffix
}

// Warm reads the state table ahead of a term that may follow (a shard
// about to be handed over to this replica), so that the term's Load
// reads only the buckets written since: what the last leader wrote
// until it resigned. The term then waits for one small read, not for
// the whole table (~1 MB a shard of 56,000 entries, from an etcd busy
// with a cluster's loads). What Warm read is kept until the next Load
// or Cool.
func (s *Store) Warm(ctx context.Context) error {
	kvs, rev, err := s.scanBuckets(ctx)
	if err != nil {
		return fmt.Errorf("store: warm: %w", err)
	}
	w := &warmBuckets{rev: rev, buckets: make(map[string]bucketKV, len(kvs))}
	for _, kv := range kvs {
		w.buckets[kv.suffix] = kv
	}
	s.warmMu.Lock()
	s.warm = w
	s.warmMu.Unlock()
	return nil
}

// Cool drops what Warm read, when no term follows it.
func (s *Store) Cool() { s.takeWarm() }

func (s *Store) takeWarm() *warmBuckets {
	s.warmMu.Lock()
	defer s.warmMu.Unlock()
	w := s.warm
	s.warm = nil
	return w
}

// readBuckets reads every state bucket, from what Warm read and the
// buckets written since when it can, else whole; and the keys of the
// per-entry layout before buckets (legacyFormat), which the first write
// migrates.
func (s *Store) readBuckets(ctx context.Context) ([]bucketKV, []*mvccpb.KeyValue, error) {
	if w := s.takeWarm(); w != nil {
		kvs, legacy, ok, err := s.readSince(ctx, w)
		if err != nil || ok {
			return kvs, legacy, err
		}
	}
	kvs, _, err := s.scanBuckets(ctx)
	if err != nil {
		return nil, nil, err
	}
	legacy, err := s.cli.Get(ctx, s.legacyPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	return kvs, legacy.Kvs, nil
}

// scanBuckets reads every state bucket in pages of StatePage, all at the
// first page's revision, which it returns.
func (s *Store) scanBuckets(ctx context.Context) ([]bucketKV, int64, error) {
	var kvs []bucketKV
	rev, err := etcdscan.Prefix(ctx, s.cli, s.bucketPrefix(), StatePage, func(r *mvccpb.KeyValue) {
		if suffix, ok := BucketAt(s.prefix, r.Key); ok {
			kvs = append(kvs, bucketKV{suffix, r.Value, r.ModRevision})
		}
	})
	return kvs, rev, err
}

// readSince brings w up to date in one read-only transaction (a term's
// start on a loaded etcd waits ~0.3-3 s for each read): every bucket's
// key and revision, the values of those written after w's read, and the
// legacy keys. A bucket kept is one whose revision is w's; one deleted
// since is gone from the keys. ok is false when what etcd says does not
// fit w (a bucket older than w's read that w lacks): the caller reads
// whole.
func (s *Store) readSince(ctx context.Context, w *warmBuckets) (kvs []bucketKV, legacy []*mvccpb.KeyValue, ok bool, err error) {
	p := s.bucketPrefix()
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithMinModRev(w.rev+1)),
		clientv3.OpGet(s.legacyPrefix(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, nil, false, err
	}
	legacy = resp.Responses[2].GetResponseRange().GetKvs()
	fresh := map[string][]byte{}
	for _, r := range resp.Responses[1].GetResponseRange().GetKvs() {
		fresh[string(r.Key)] = r.Value
	}
	for _, r := range resp.Responses[0].GetResponseRange().GetKvs() {
		suffix, isBucket := BucketAt(s.prefix, r.Key)
		if !isBucket {
			continue
		}
		if r.ModRevision > w.rev {
			v, read := fresh[string(r.Key)]
			if !read {
				return nil, nil, false, nil
			}
			kvs = append(kvs, bucketKV{suffix, v, r.ModRevision})
			continue
		}
		old, had := w.buckets[suffix]
		if !had || old.rev != r.ModRevision {
			return nil, nil, false, nil
		}
		kvs = append(kvs, old)
	}
	return kvs, legacy, true, nil
}
