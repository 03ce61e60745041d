package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotLeader means a guarded write was refused: the leader key is gone
// or belongs to a newer term. Nothing was changed.
var ErrNotLeader = errors.New("store: not leader")

// legacyFormat is the per-entry JSON layout of beatd before packed
// buckets; Load still reads it, and the first full write removes it.
const legacyFormat = 1

// MaxOpsPerTxn is etcd's default --max-txn-ops.
const MaxOpsPerTxn = 128

// maxTxnBytes bounds one transaction's values. etcd holds recent raft
// entries in memory (up to its snapshot count), so many small
// transactions cost less memory than a few huge ones, and it keeps every
// request far below etcd's 1.5 MiB request limit.
const maxTxnBytes = 64 << 10

// DefaultRemovedGrace is how long the state of an entry removed from the
// config is kept, so a config rolled back within it resumes where it was.
const DefaultRemovedGrace = 7 * 24 * time.Hour

// Store reads and writes entry state under a prefix.
type Store struct {
	cli       *clientv3.Client
	prefix    string
	auditKeep int
}

// New returns a Store for the cluster under prefix, e.g. "/beatd/default/".
func New(cli *clientv3.Client, prefix string) *Store {
	return &Store{cli: cli, prefix: prefix}
}

func (s *Store) legacyPrefix() string   { return keys.LegacyEntries(s.prefix) }
func (s *Store) bucketPrefix() string   { return keys.State(s.prefix) }
func (s *Store) bucketKey(b int) string { return fmt.Sprintf("%s%02x", s.bucketPrefix(), b) }

// BucketAt returns the index of the state bucket stored at key under
// prefix, or -1 for any other key: readers of the raw keys (the console's
// mirror) need the layout without owning it.
func BucketAt(prefix string, key []byte) int {
	suffix, ok := strings.CutPrefix(string(key), keys.State(prefix))
	if !ok || len(suffix) != 2 {
		return -1
	}
	b, err := strconv.ParseUint(suffix, 16, 8)
	if err != nil {
		return -1
	}
	return int(b)
}

// Load reads every entry's state.
func (s *Store) Load(ctx context.Context) (*Table, error) {
	t := NewTable()
	resp, err := s.cli.Get(ctx, s.bucketPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("store: load: %w", err)
	}
	for _, kv := range resp.Kvs {
		if err := t.loadBucket(kv.Value); err != nil {
			return nil, fmt.Errorf("store: load %q: %w", kv.Key, err)
		}
	}
	legacy, err := s.cli.Get(ctx, s.legacyPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("store: load: %w", err)
	}
	for _, kv := range legacy.Kvs {
		name := strings.TrimPrefix(string(kv.Key), s.legacyPrefix())
		st, err := decodeLegacy(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("store: load %q: %w", kv.Key, err)
		}
		st.Name = name
		if _, ok := t.Get(name); !ok {
			t.Set(st) // dirty: the next write migrates it
		}
		t.legacy = append(t.legacy, string(kv.Key))
	}
	return t, nil
}

// Get reads one entry's state (from its bucket, or its v1 key not yet
// migrated); an entry etcd has no state for has zero state.
func (s *Store) Get(ctx context.Context, name string) (*EntryState, error) {
	b := BucketOf(name)
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.bucketKey(b)), clientv3.OpGet(s.legacyPrefix()+name)).Commit()
	if err != nil {
		return nil, fmt.Errorf("store: get %q: %w", name, err)
	}
	st := &EntryState{Name: name}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		var found bool
		if err := eachRecord(kvs[0].Value, func(r EntryState) {
			if r.Name == name {
				*st, found = r, true
			}
		}); err != nil {
			return nil, fmt.Errorf("store: get %q: %w", name, err)
		}
		if found {
			return st, nil
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		legacy, err := decodeLegacy(kvs[0].Value)
		if err != nil {
			return nil, fmt.Errorf("store: get %q: %w", name, err)
		}
		legacy.Name = name
		return &legacy, nil
	}
	return st, nil
}

// decodeLegacy reads a v1 per-entry JSON value. Its run history and
// counters are dropped: they now live with the broker.
func decodeLegacy(b []byte) (EntryState, error) {
	var v struct {
		Version   int       `json:"v"`
		LastSlot  time.Time `json:"last_slot"`
		Paused    bool      `json:"paused"`
		RemovedAt time.Time `json:"removed_at"`
		Since     time.Time `json:"since"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return EntryState{}, err
	}
	if v.Version > legacyFormat {
		return EntryState{}, fmt.Errorf("state format v%d is not a per-entry format this beatd reads", v.Version)
	}
	return EntryState{LastSlot: v.LastSlot, Paused: v.Paused, RemovedAt: v.RemovedAt, Since: v.Since}, nil
}

// Save writes t's dirty buckets, and deletes the keys in also (completed
// admin requests) in the last transaction, so a request is gone only once
// the state it changed is stored. Every transaction is guarded by g; if
// leadership was lost it returns ErrNotLeader and that transaction changed
// nothing. Buckets written are marked clean; on any error the rest stay
// dirty for the next call. Each transaction holds whole buckets, so state
// is never torn.
func (s *Store) Save(ctx context.Context, g election.Fence, t *Table, also []string) error {
	type bucket struct {
		b   int
		enc []byte
	}
	var (
		ops     = make([]clientv3.Op, 0, 16)
		written []bucket
		size    int
	)
	commit := func() error {
		if err := s.commit(ctx, g, ops); err != nil {
			return err
		}
		for _, w := range written {
			t.written(w.b, w.enc)
		}
		ops, written, size = ops[:0], written[:0], 0
		return nil
	}
	for b := range NumBuckets {
		if !t.dirty[b] {
			continue
		}
		var enc []byte
		if len(t.open(b)) == 0 {
			ops = append(ops, clientv3.OpDelete(s.bucketKey(b)))
		} else {
			enc = t.appendBucket(nil, b)
			ops = append(ops, clientv3.OpPut(s.bucketKey(b), string(enc)))
			size += len(enc)
		}
		written = append(written, bucket{b, enc})
		if len(ops) == MaxOpsPerTxn || size >= maxTxnBytes {
			if err := commit(); err != nil {
				return err
			}
		}
	}
	// Everything is in buckets now: the v1 keys can go.
	for len(t.legacy) > 0 {
		if len(ops) == MaxOpsPerTxn {
			if err := commit(); err != nil {
				return err
			}
		}
		n := min(len(t.legacy), MaxOpsPerTxn-len(ops))
		for _, k := range t.legacy[:n] {
			ops = append(ops, clientv3.OpDelete(k))
		}
		if err := commit(); err != nil {
			return err
		}
		t.legacy = t.legacy[n:]
	}
	for _, k := range also {
		if len(ops) == MaxOpsPerTxn {
			if err := commit(); err != nil {
				return err
			}
		}
		ops = append(ops, clientv3.OpDelete(k))
	}
	return commit()
}

func (s *Store) commit(ctx context.Context, g election.Fence, ops []clientv3.Op) error {
	if len(ops) == 0 {
		return nil
	}
	resp, err := s.cli.Txn(ctx).If(g.Held()).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("store: commit %d ops: %w", len(ops), err)
	}
	if !resp.Succeeded {
		return ErrNotLeader
	}
	return nil
}
