package store

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ImportedState is what another scheduler (celery beat) last sent for an
// entry: the nominal slot beatd continues after.
type ImportedState struct {
	Name     string
	LastSlot time.Time
}

// Import writes each entry's last slot so the first leader catches up from
// it by the entry's policy instead of starting fresh. It refuses entries
// that beatd has already fired (a last slot not itself imported),
// returning their names, unless force. It is meant for a cutover, before
// any beatd leads: writes are not fenced, but each is a transaction on the
// bucket's revision, so a concurrent write is never lost silently (the
// entry is refused).
func (s *Store) Import(ctx context.Context, states []ImportedState, force bool) (refused []string, err error) {
	digits, err := s.layout(ctx)
	if err != nil {
		return nil, err
	}
	for _, in := range states {
		t := newTable(digits)
		b := t.bucketOf(in.Name)
		key := s.bucketPrefix() + t.suffix(b)
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
		}
		var rev int64
		if len(resp.Kvs) > 0 {
			rev = resp.Kvs[0].ModRevision
			if err := t.loadBucket(resp.Kvs[0].Value); err != nil {
				return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
			}
		}
		st, _ := t.Get(in.Name)
		if st.Name == "" {
			// Not in a bucket: an entry fired by a beatd before packed
			// state still has its per-entry key.
			old, err := s.Get(ctx, in.Name)
			if err != nil {
				return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
			}
			st = *old
		}
		if !st.LastSlot.IsZero() && !st.Imported && !force {
			refused = append(refused, in.Name)
			continue
		}
		// Since is left zero: the baseline of an earlier start must not
		// hide the slots after the imported one.
		t.Set(EntryState{Name: in.Name, LastSlot: in.LastSlot.UTC(), Paused: st.Paused, Imported: true})
		enc := t.appendBucket(nil, b)
		txn, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(enc))).Commit()
		if err != nil {
			return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
		}
		if !txn.Succeeded {
			refused = append(refused, in.Name) // written meanwhile: look again
		}
	}
	return refused, nil
}

// layout is the layout of the stored buckets (that of the first key; the
// first layout when there are none).
func (s *Store) layout(ctx context.Context) (int, error) {
	resp, err := s.cli.Get(ctx, s.bucketPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0, fmt.Errorf("store: read the state layout: %w", err)
	}
	if len(resp.Kvs) > 0 {
		if suffix, ok := BucketAt(s.prefix, resp.Kvs[0].Key); ok {
			return len(suffix), nil
		}
	}
	return 2, nil
}
