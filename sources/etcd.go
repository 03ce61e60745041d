package sources

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/beatd/beatd/internal/etcdscan"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/retry"
	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Errors of the entries store.
var (
	// ErrNotFound: no runtime entry by that name.
	ErrNotFound = errors.New("no such entry")
	// ErrPrecondition: If-Match named a revision the entry no longer has
	// (a lost update), or asked to create an entry that exists.
	ErrPrecondition = errors.New("the entry changed since the revision given in If-Match")
)

// Doc is a runtime entry as stored: its document and etcd mod revision.
type Doc struct {
	Name        string
	Data        []byte // JSON in the schema of a schedules.yaml entry
	ModRevision int64
}

// Entries keeps the runtime entries of the entries API in etcd, one key
// per entry, and feeds them to a Merger. An unsharded cluster keeps them
// under <prefix>defs/NAME; shard i of a sharded one under its shard's
// prefix, keys.Defs(keys.Shard(prefix, i, n)), so a shard's definitions
// are one range read and one watch. A store over every shard routes each
// name to its shard; Shard(i) is the store of one shard alone, which a
// shard's leader loads and follows (Load, Sync).
type Entries struct {
	cli *clientv3.Client
	// defs is each shard's definitions prefix, by shard (one for an
	// unsharded cluster, and for a store of one shard).
	defs []string
	// prefix is defs[0], for the single-prefix reads (Load, Sync).
	prefix string
	// Clock paces the watch's retries and its coalescing (NewEntries sets
	// the real clock; the daemon sets its own).
	Clock clockwork.Clock
}

// NewEntries returns the store of an unsharded cluster's runtime entries.
func NewEntries(cli *clientv3.Client, prefix string) *Entries {
	return NewShardedEntries(cli, prefix, 1)
}

// NewShardedEntries returns the store of the runtime entries of a
// cluster of n shards (n <= 1: NewEntries). Sharding has not shipped in a
// release with another layout of the definitions, so no sharded cluster
// keeps them under <prefix>defs/ and none needs migrating.
func NewShardedEntries(cli *clientv3.Client, prefix string, n int) *Entries {
	n = max(n, 1)
	defs := make([]string, n)
	for i := range defs {
		defs[i] = keys.Defs(keys.Shard(prefix, i, n))
	}
	return &Entries{cli: cli, defs: defs, prefix: defs[0], Clock: clockwork.NewRealClock()}
}

// Shard is the store of shard i's runtime entries alone (the same store
// when there is one shard).
func (s *Entries) Shard(i int) *Entries {
	return &Entries{cli: s.cli, defs: []string{s.defs[i]}, prefix: s.defs[i], Clock: s.Clock}
}

// Shards is the number of shards the store spans.
func (s *Entries) Shards() int { return len(s.defs) }

// defsOf is the definitions prefix of name's shard.
func (s *Entries) defsOf(name string) string { return s.defs[keys.ShardOf(name, len(s.defs))] }

func (s *Entries) key(name string) string { return s.defsOf(name) + name }

// listPage is how many entries one range read of List returns: a
// million entries are read as 200 reads of ~1 MB, never as one response
// of ~100 MB that etcd must build and hold at once.
const listPage = 5000

// List returns every runtime entry, by name, and the revision read.
func (s *Entries) List(ctx context.Context) ([]Doc, int64, error) {
	var out []Doc
	rev, err := s.scan(ctx, func(d Doc) { out = append(out, d) })
	if len(s.defs) > 1 {
		slices.SortFunc(out, func(a, b Doc) int { return strings.Compare(a.Name, b.Name) })
	}
	return out, rev, err
}

// scan calls fn with every runtime entry, reading pages of listPage,
// every page of a shard at its first page's revision, so what it sees of
// a shard is one consistent snapshot; in name order within a shard, shard
// after shard. It returns the revision of the last shard read (of the one
// shard for Sync).
func (s *Entries) scan(ctx context.Context, fn func(Doc)) (int64, error) {
	var rev int64
	for _, p := range s.defs {
		r, err := etcdscan.Prefix(ctx, s.cli, p, listPage, func(kv *mvccpb.KeyValue) { fn(docOf(p, kv)) })
		if err != nil {
			return 0, fmt.Errorf("entries: list: %w", err)
		}
		rev = r
	}
	return rev, nil
}

// docOf is a key-value stored under the definitions prefix p as a Doc.
// Its name is a string of its own: trimmed from the whole key, the name
// kept in the Merger's maps would hold the prefix's bytes too, once per
// entry: a sharded key's prefix (".../shards/<i>/defs/") is often longer
// than the name.
func docOf(p string, kv *mvccpb.KeyValue) Doc {
	name := kv.Key
	if len(name) >= len(p) && string(name[:len(p)]) == p {
		name = name[len(p):]
	}
	return Doc{Name: string(name), Data: kv.Value, ModRevision: kv.ModRevision}
}

// Get returns one runtime entry.
func (s *Entries) Get(ctx context.Context, name string) (Doc, error) {
	resp, err := s.cli.Get(ctx, s.key(name))
	if err != nil {
		return Doc{}, fmt.Errorf("entries: get %q: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return Doc{}, ErrNotFound
	}
	kv := resp.Kvs[0]
	return Doc{Name: name, Data: kv.Value, ModRevision: kv.ModRevision}, nil
}

// Put stores docs in one transaction, over every shard they belong to
// (etcd's transactions span any keys), so an apply is all or nothing on
// a sharded cluster too. ifMatch holds, per name, the mod
// revision the entry must still have (0: must not exist); names not in it
// are written unconditionally. A failed condition is ErrPrecondition and
// writes nothing. It returns the revision written.
func (s *Entries) Put(ctx context.Context, docs []Doc, ifMatch map[string]int64) (int64, error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, d := range docs {
		if rev, ok := ifMatch[d.Name]; ok {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.key(d.Name)), "=", rev))
		}
		ops = append(ops, clientv3.OpPut(s.key(d.Name), string(d.Data)))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("entries: put: %w", err)
	}
	if !resp.Succeeded {
		return 0, ErrPrecondition
	}
	return resp.Header.Revision, nil
}

// Delete removes a runtime entry; ifMatch > 0 requires that mod revision.
func (s *Entries) Delete(ctx context.Context, name string, ifMatch int64) error {
	key := s.key(name)
	cmp := clientv3.Compare(clientv3.CreateRevision(key), ">", 0)
	if ifMatch > 0 {
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", ifMatch)
	}
	resp, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpDelete(key)).Else(clientv3.OpGet(key, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return fmt.Errorf("entries: delete %q: %w", name, err)
	}
	if !resp.Succeeded {
		if resp.Responses[0].GetResponseRange().Count == 0 {
			return ErrNotFound
		}
		return ErrPrecondition
	}
	return nil
}

// Sync feeds the runtime entries of a store of one shard (or of an
// unsharded cluster) to m until ctx ends: a full read, then a
// watch from that revision; any watch failure (compaction, lost etcd)
// starts over with a full read, and is reported as the source's error
// meanwhile, the last good set staying in use. from > 0 is the revision
// of a read already given to m (the start's): the first watch follows on
// from it instead of reading everything again.
func (s *Entries) Sync(ctx context.Context, m Sink, from int64) {
	b := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		err := s.syncOnce(ctx, m, from)
		from = 0
		if ctx.Err() != nil {
			return
		}
		m.SetError(API, err)
		if !retry.Sleep(ctx, s.Clock, b.NextBackOff()) {
			return
		}
	}
}

// Load reads every runtime entry and gives them to m; it returns the
// revision read, for Sync.
func (s *Entries) Load(ctx context.Context, m Sink) (int64, error) {
	set := map[string][]byte{}
	rev, err := s.scan(ctx, func(d Doc) { set[d.Name] = d.Data })
	if err != nil {
		return 0, err
	}
	if err := m.SetSource(API, set); err != nil {
		return 0, fmt.Errorf("apply runtime entries: %w", err)
	}
	return rev, nil
}

func (s *Entries) syncOnce(ctx context.Context, m Sink, rev int64) error {
	if rev == 0 {
		var err error
		if rev, err = s.Load(ctx, m); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	// A change applies at once; changes that follow within coalesceFor
	// of the last apply wait for it to pass and apply together: an apply
	// costs the merge of the changed entries plus a copy of the running
	// set's index, so a large `entries apply` (thousands of transactions
	// in a row) is applied a few times a second, not once per
	// transaction.
	var (
		changes   = map[string][]byte{} // name -> document; nil: deleted
		lastApply time.Time
		timer     clockwork.Timer
		due       <-chan time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	apply := func() error {
		due, lastApply = nil, s.Clock.Now()
		if err := m.UpdateSource(API, changes); err != nil {
			return fmt.Errorf("apply runtime entries: %w", err)
		}
		changes = map[string][]byte{}
		return nil
	}
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return errors.New("watch runtime entries: channel closed")
			}
			if err := resp.Err(); err != nil {
				return fmt.Errorf("watch runtime entries: %w", err)
			}
			for _, ev := range resp.Events {
				name := strings.TrimPrefix(string(ev.Kv.Key), s.prefix)
				if ev.Type == clientv3.EventTypeDelete {
					changes[name] = nil
				} else {
					changes[name] = ev.Kv.Value
				}
			}
			if len(resp.Events) == 0 {
				continue
			}
			if wait := coalesceFor - s.Clock.Since(lastApply); wait <= 0 {
				if err := apply(); err != nil {
					return err
				}
			} else if due == nil {
				if timer == nil {
					timer = s.Clock.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				due = timer.Chan()
			}
		case <-due:
			if len(changes) > 0 {
				if err := apply(); err != nil {
					return err
				}
			}
		}
	}
}

// coalesceFor is the shortest time between two applies of the runtime
// entries: a burst of writes is applied about this often, and in full
// once it ends.
const coalesceFor = 500 * time.Millisecond

// pageRange is the keys under the definitions prefix p of the names that
// come after after ("": from the first) and start with prefix.
func pageRange(p, after, prefix string) (from, end string) {
	from, end = p+prefix, clientv3.GetPrefixRangeEnd(p+prefix)
	if k := p + after + "\x00"; after != "" && k > from {
		from = k
	}
	return from, end
}

// Window returns at most limit runtime entries, in name order, whose names
// come after after ("": from the first) and start with prefix, and
// whether more follow: one range read of at most limit keys per shard,
// merged by name, for a page of the entries API.
func (s *Entries) Window(ctx context.Context, after, prefix string, limit int) ([]Doc, bool, error) {
	var (
		out  []Doc
		more bool
	)
	for _, p := range s.defs {
		from, end := pageRange(p, after, prefix)
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(limit)),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return nil, false, fmt.Errorf("entries: list: %w", err)
		}
		more = more || resp.More
		for _, kv := range resp.Kvs {
			out = append(out, docOf(p, kv))
		}
	}
	if len(s.defs) > 1 {
		slices.SortFunc(out, func(a, b Doc) int { return strings.Compare(a.Name, b.Name) })
	}
	if len(out) > limit {
		out, more = out[:limit], true
	}
	return out, more, nil
}

// Count is how many runtime entries' names come after after ("": from
// the first) and start with prefix: a count-only read per shard.
func (s *Entries) Count(ctx context.Context, after, prefix string) (int, error) {
	n := 0
	for _, p := range s.defs {
		from, end := pageRange(p, after, prefix)
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithCountOnly())
		if err != nil {
			return 0, fmt.Errorf("entries: count: %w", err)
		}
		n += int(resp.Count)
	}
	return n, nil
}

// Names calls fn with the name of each runtime entry whose name comes
// after after and starts with prefix, shard by shard: keys-only range
// reads of listPage keys.
func (s *Entries) Names(ctx context.Context, after, prefix string, fn func(name string)) error {
	for _, p := range s.defs {
		from, end := pageRange(p, after, prefix)
		for {
			resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(listPage),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithKeysOnly())
			if err != nil {
				return fmt.Errorf("entries: names: %w", err)
			}
			for _, kv := range resp.Kvs {
				fn(strings.TrimPrefix(string(kv.Key), p))
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
	return nil
}

// GetMany returns the named runtime entries that exist, by name, read in
// transactions of at most maxOps gets.
func (s *Entries) GetMany(ctx context.Context, names []string, maxOps int) (map[string]Doc, error) {
	out := make(map[string]Doc, len(names))
	for len(names) > 0 {
		n := min(len(names), max(maxOps, 1))
		ops := make([]clientv3.Op, n)
		for i, name := range names[:n] {
			ops[i] = clientv3.OpGet(s.key(name))
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("entries: get %d: %w", n, err)
		}
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
				out[names[i]] = Doc{Name: names[i], Data: kvs[0].Value, ModRevision: kvs[0].ModRevision}
			}
		}
		names = names[n:]
	}
	return out, nil
}
