package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/etcdscan"
	"github.com/beatd/beatd/internal/keys"
	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotLeader means a guarded write was refused: the leader key is gone
// or belongs to a newer term. Nothing was changed.
var ErrNotLeader = errors.New("store: not leader")

// legacyFormat is the per-entry JSON layout of beatd before packed
// buckets; Load still reads it, and the first full write removes it.
const legacyFormat = 1

// MaxOpsPerTxn is etcd's default --max-txn-ops: the most operations a
// Store puts in one transaction unless WithMaxOps says otherwise.
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
	maxOps    int // etcd's --max-txn-ops
	clock     clockwork.Clock

	warmMu sync.Mutex
	warm   *warmBuckets // Warm's, for the next Load
}

// New returns a Store for the cluster under prefix, e.g. "/beatd/default/".
func New(cli *clientv3.Client, prefix string) *Store {
	return &Store{cli: cli, prefix: prefix, maxOps: MaxOpsPerTxn, clock: clockwork.NewRealClock()}
}

// WithClock makes s keep its periods (Compact) on clock: the daemon's.
func (s *Store) WithClock(clock clockwork.Clock) *Store {
	if clock != nil {
		s.clock = clock
	}
	return s
}

// WithMaxOps makes s's transactions hold at most n operations: an etcd
// run with a --max-txn-ops below the default refuses larger ones.
func (s *Store) WithMaxOps(n int) *Store {
	if n > 0 {
		s.maxOps = n
	}
	return s
}

func (s *Store) legacyPrefix() string { return keys.LegacyEntries(s.prefix) }
func (s *Store) bucketPrefix() string { return keys.State(s.prefix) }

// BucketAt returns the layout and index of the state bucket stored at key
// under prefix (its suffix is 2, 3 or 4 hex digits), or ok false for any
// other key: readers of the raw keys (the console's mirror) need the
// layout without owning it.
func BucketAt(prefix string, key []byte) (suffix string, ok bool) {
	suffix, ok = strings.CutPrefix(string(key), keys.State(prefix))
	if !ok || len(suffix) < 2 || len(suffix) > 4 {
		return "", false
	}
	if _, err := strconv.ParseUint(suffix, 16, 16); err != nil {
		return "", false
	}
	return suffix, true
}

// StatePage is how many bucket keys one range read of the state table
// returns (Load's, and the console's mirror): the 65,536 buckets of a
// million entries (~20 MB) are 32 reads of ~600 KB, not 256 round trips,
// nor one read that etcd must build whole.
const StatePage = 2048

// Load reads every entry's state. Buckets are read in pages, all at the
// first page's revision. Keys of more than one layout (a move between
// layouts that a lost leader did not finish) are merged entry by entry,
// the copy in the key written last winning, and the table is left to
// rewrite them in one layout. After Warm, it reads only the buckets
// written since.
func (s *Store) Load(ctx context.Context) (*Table, error) {
	kvs, legacy, err := s.readBuckets(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: load: %w", err)
	}
	layout := map[int]int{} // digits -> keys
	for _, r := range kvs {
		layout[len(r.suffix)]++
	}
	var t *Table
	switch len(layout) {
	case 0:
		t = NewTable()
	case 1:
		for d := range layout {
			t = newTable(d)
		}
		for _, r := range kvs {
			if err := t.loadBucket(r.value); err != nil {
				return nil, fmt.Errorf("store: load %q: %w", s.bucketPrefix()+r.suffix, err)
			}
		}
	default:
		type found struct {
			rev int64
			st  EntryState
		}
		best := map[string]found{}
		for _, r := range kvs {
			if err := eachRecord(r.value, func(st EntryState) {
				if b, ok := best[st.Name]; !ok || r.rev > b.rev {
					best[st.Name] = found{r.rev, st}
				}
			}); err != nil {
				return nil, fmt.Errorf("store: load %q: %w", s.bucketPrefix()+r.suffix, err)
			}
		}
		t = newTable(layoutDigits(len(best), 2))
		for _, b := range best {
			t.Set(b.st) // every bucket of the layout kept is rewritten
		}
		for _, r := range kvs {
			if len(r.suffix) != t.digits {
				t.stale = append(t.stale, r.suffix)
			}
		}
	}
	for _, kv := range legacy {
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
	// The entry's bucket in each layout, and its v1 key: one read, and
	// the copy in the key written last wins (a move between layouts may
	// be half done).
	ops := make([]clientv3.Op, 0, len(layouts)+1)
	for _, d := range layouts {
		ops = append(ops, clientv3.OpGet(s.bucketPrefix()+bucketSuffix(d, bucketOf(name, layoutBuckets(d)))))
	}
	ops = append(ops, clientv3.OpGet(s.legacyPrefix()+name))
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("store: get %q: %w", name, err)
	}
	st := &EntryState{Name: name}
	var rev int64
	for _, r := range resp.Responses[:len(layouts)] {
		kvs := r.GetResponseRange().GetKvs()
		if len(kvs) == 0 || kvs[0].ModRevision < rev {
			continue
		}
		if err := eachRecord(kvs[0].Value, func(r EntryState) {
			if r.Name == name {
				*st, rev = r, kvs[0].ModRevision
			}
		}); err != nil {
			return nil, fmt.Errorf("store: get %q: %w", name, err)
		}
	}
	if rev > 0 {
		return st, nil
	}
	if kvs := resp.Responses[len(layouts)].GetResponseRange().GetKvs(); len(kvs) > 0 {
		legacy, err := decodeLegacy(kvs[0].Value)
		if err != nil {
			return nil, fmt.Errorf("store: get %q: %w", name, err)
		}
		legacy.Name = name
		return &legacy, nil
	}
	return st, nil
}

// layouts are the bucket layouts, by hex digits of their keys.
var layouts = [...]int{2, 3, 4}

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
		scratch []byte // each bucket is encoded here, then copied once for the table
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
	for b := range t.enc {
		if !t.dirty[b] {
			continue
		}
		var enc []byte
		if t.empty(b) {
			ops = append(ops, clientv3.OpDelete(s.bucketPrefix()+t.suffix(b)))
		} else {
			scratch = t.appendBucket(scratch[:0], b)
			enc = make([]byte, len(scratch)) // as long as it is: the table keeps it
			copy(enc, scratch)
			ops = append(ops, clientv3.OpPut(s.bucketPrefix()+t.suffix(b), string(enc)))
			size += len(enc)
		}
		written = append(written, bucket{b, enc})
		if len(ops) == s.maxOps || size >= maxTxnBytes {
			if err := commit(); err != nil {
				return err
			}
		}
	}
	// Everything is in the table's layout now: the keys of another can
	// go, and so can the v1 keys.
	// Each batch of deletions is committed with the table's view of it
	// changed only once the commit worked.
	drain := func(keys *[]string, key func(string) string) error {
		for len(*keys) > 0 {
			if len(ops) == s.maxOps {
				if err := commit(); err != nil {
					return err
				}
			}
			n := min(len(*keys), s.maxOps-len(ops))
			for _, k := range (*keys)[:n] {
				ops = append(ops, clientv3.OpDelete(key(k)))
			}
			if err := commit(); err != nil {
				return err
			}
			*keys = (*keys)[n:]
		}
		return nil
	}
	if err := drain(&t.stale, func(suffix string) string { return s.bucketPrefix() + suffix }); err != nil {
		return err
	}
	if err := drain(&t.legacy, func(k string) string { return k }); err != nil {
		return err
	}
	for _, k := range also {
		if len(ops) == s.maxOps {
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

// StatesOf reads the state of the entries named, from their buckets
// only: a page of the entries API reads a few hundred buckets, not a
// table of a million entries. Entries without state are left out.
func (s *Store) StatesOf(ctx context.Context, names []string) (map[string]*EntryState, error) {
	digits, err := s.layout(ctx)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	var bucketKeys []string
	seen := map[int]bool{}
	for _, n := range names {
		want[n] = true
		if b := bucketOf(n, layoutBuckets(digits)); !seen[b] {
			seen[b] = true
			bucketKeys = append(bucketKeys, s.bucketPrefix()+bucketSuffix(digits, b))
		}
	}
	out := make(map[string]*EntryState, len(names))
	for len(bucketKeys) > 0 {
		n := min(len(bucketKeys), etcdscan.ReadBatch)
		ops := make([]clientv3.Op, n)
		for i, k := range bucketKeys[:n] {
			ops[i] = clientv3.OpGet(k)
		}
		bucketKeys = bucketKeys[n:]
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("store: read %d buckets: %w", n, err)
		}
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().GetKvs() {
				if err := eachRecord(kv.Value, func(st EntryState) {
					if want[st.Name] {
						st := st
						out[st.Name] = &st
					}
				}); err != nil {
					return nil, fmt.Errorf("store: read %q: %w", kv.Key, err)
				}
			}
		}
	}
	return out, nil
}
