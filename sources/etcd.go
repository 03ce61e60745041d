package sources

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/retry"
	"github.com/jonboulle/clockwork"
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
// per entry, <prefix>defs/NAME, and feeds them to a Merger.
type Entries struct {
	cli    *clientv3.Client
	prefix string
	clock  clockwork.Clock // the watch's retries wait on it
}

// NewEntries returns the store under the cluster's prefix.
func NewEntries(cli *clientv3.Client, prefix string) *Entries {
	return &Entries{cli: cli, prefix: keys.Defs(prefix), clock: clockwork.NewRealClock()}
}

func (s *Entries) key(name string) string { return s.prefix + name }

// List returns every runtime entry, by name, and the revision read.
func (s *Entries) List(ctx context.Context) ([]Doc, int64, error) {
	resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, fmt.Errorf("entries: list: %w", err)
	}
	out := make([]Doc, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, Doc{Name: strings.TrimPrefix(string(kv.Key), s.prefix), Data: kv.Value, ModRevision: kv.ModRevision})
	}
	return out, resp.Header.Revision, nil
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

// Put stores docs in one transaction. ifMatch holds, per name, the mod
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

// Sync feeds the runtime entries to m until ctx ends: a full read, then a
// watch from that revision; any watch failure (compaction, lost etcd)
// starts over with a full read, and is reported as the source's error
// meanwhile, the last good set staying in use.
func (s *Entries) Sync(ctx context.Context, m *Merger) {
	b := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		err := s.syncOnce(ctx, m)
		if ctx.Err() != nil {
			return
		}
		m.SetError(API, err)
		if !retry.Sleep(ctx, s.clock, b.NextBackOff()) {
			return
		}
	}
}

func (s *Entries) syncOnce(ctx context.Context, m *Merger) error {
	docs, rev, err := s.List(ctx)
	if err != nil {
		return err
	}
	set := make(map[string][]byte, len(docs))
	for _, d := range docs {
		set[d.Name] = d.Data
	}
	if err := m.SetSource(API, cloneDocs(set)); err != nil {
		return fmt.Errorf("apply runtime entries: %w", err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	// A change applies at once; changes that follow within coalesceFor
	// of the last apply wait for it to pass and apply together. Each apply
	// re-merges every entry, so a large `entries apply` (hundreds of
	// transactions in a row) would otherwise cost transactions × entries.
	var (
		changed   bool
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
		changed, due, lastApply = false, nil, s.clock.Now()
		if err := m.SetSource(API, cloneDocs(set)); err != nil {
			return fmt.Errorf("apply runtime entries: %w", err)
		}
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
					delete(set, name)
				} else {
					set[name] = ev.Kv.Value
				}
			}
			if len(resp.Events) == 0 {
				continue
			}
			changed = true
			if wait := coalesceFor - s.clock.Since(lastApply); wait <= 0 {
				if err := apply(); err != nil {
					return err
				}
			} else if due == nil {
				if timer == nil {
					timer = s.clock.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				due = timer.Chan()
			}
		case <-due:
			if changed {
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

// cloneDocs copies the map (the merger keeps it).
func cloneDocs(m map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
