package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/sources"
)

// shardDefsLoadTimeout bounds the range read of one shard's runtime
// entries at the start of its term.
const shardDefsLoadTimeout = time.Minute

// shardDefs loads shard i's runtime entries for a term of the shard: one
// range read of its definitions (keys.Defs of its shard prefix), given to
// the merger as that shard's part of the entries API's source, which
// reaches the shard's scheduler before its term begins (so the state of
// none of them is taken for a removed entry's), then one watch from that
// revision. The returned stop ends the watch and drops the shard's
// entries, so a replica holds the runtime entries of the shards it leads
// and no others.
func (m *Main) shardDefs(ctx context.Context, i int) (stop func(), err error) {
	n := m.Shards
	part := m.merger.Part(func(name string) bool { return keys.ShardOf(name, n) == i })
	st := m.entries.Shard(i)
	start := m.clock.Now()
	lctx, cancel := context.WithTimeout(ctx, shardDefsLoadTimeout)
	rev, err := st.Load(lctx, part)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("shard %d: read runtime entries: %w", i, err)
	}
	m.log.Info("shard's runtime entries loaded", "shard", i, "took", m.clock.Since(start).String())
	wctx, cancelWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { st.Sync(wctx, part, rev) })
	return func() {
		cancelWatch()
		wg.Wait()
		if err := part.SetSource(sources.API, nil); err != nil {
			m.log.Error("dropping a shard's runtime entries failed", "shard", i, "err", err)
		}
	}, nil
}

// runningConfig is the config this replica runs: the scheduler's on an
// unsharded replica; on a sharded one the merger's (the file's and
// django-celery-beat's entries of every shard, the runtime entries of the
// shards it leads), which its shards' schedulers hold in parts and no
// scheduler holds whole.
func (m *Main) runningConfig() *config.Config {
	if m.Shards > 1 {
		return m.merger.Current()
	}
	return m.sched.Config()
}

// entryOf is the definition of the entry named, wherever it runs: from
// the config this replica runs, else, on a sharded replica, from the
// runtime entries of a shard it does not lead, read from etcd and parsed
// as the merger parses them (nil: no such entry).
func (m *Main) entryOf(ctx context.Context, name string) (*config.Entry, error) {
	if e := m.runningConfig().Entry(name); e != nil || m.Shards <= 1 {
		return e, nil
	}
	d, err := m.entries.Get(ctx, name)
	if errors.Is(err, sources.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	e, err := m.merger.File().ParseEntry(name, d.Data)
	if err != nil {
		return nil, nil // an invalid runtime entry runs nowhere
	}
	e.Source = sources.API
	return e, nil
}

// remoteEntries is, for a page of /status on a sharded replica, the
// runtime entries of the shards it does not lead that the page may show:
// the first limit+1 whose names follow after and start with prefix (one
// range read of at most that many per shard), parsed as the merger parses
// them, less the names of the config it runs; and how many runtime
// entries of those shards follow in all (a count-only read per shard).
// So a page costs reads bounded by its size, whatever the cluster's.
func (m *Main) remoteEntries(ctx context.Context, after, prefix string, limit int) ([]*config.Entry, int, error) {
	held := m.runningConfig()
	file := m.merger.File()
	var (
		docs  []sources.Doc
		total int
	)
	for i := range m.Shards {
		if m.shards != nil && m.shards.leads(i) {
			continue
		}
		st := m.entries.Shard(i)
		win, _, err := st.Window(ctx, after, prefix, limit+1)
		if err != nil {
			return nil, 0, err
		}
		docs = append(docs, win...)
		n, err := st.Count(ctx, after, prefix)
		if err != nil {
			return nil, 0, err
		}
		total += n
	}
	slices.SortFunc(docs, func(a, b sources.Doc) int { return strings.Compare(a.Name, b.Name) })
	out := make([]*config.Entry, 0, min(len(docs), limit+1))
	for _, d := range docs {
		if len(out) > limit {
			break
		}
		if held.Entry(d.Name) != nil {
			continue // another source's entry runs under that name
		}
		e, err := file.ParseEntry(d.Name, d.Data)
		if err != nil {
			continue // an invalid runtime entry runs nowhere
		}
		e.Source = sources.API
		out = append(out, e)
	}
	return out, total, nil
}
