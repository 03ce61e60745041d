package daemon

import (
	"cmp"
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
// as the merger parses them (nil: no such entry). A name of such a shard
// that the config this replica runs defines in a source the runtime
// entries outrank (--sources-priority) runs as its runtime entry, if it
// has one, as on the shard's leader.
func (m *Main) entryOf(ctx context.Context, name string) (*config.Entry, error) {
	held := m.runningConfig().Entry(name)
	if m.Shards <= 1 || held != nil && (m.shards != nil && m.shards.leads(keys.ShardOf(name, m.Shards)) || !runsOver(m.merger, held)) {
		return held, nil
	}
	d, err := m.entries.Get(ctx, name)
	if errors.Is(err, sources.ErrNotFound) {
		return held, nil
	}
	if err != nil {
		return nil, err
	}
	if e := remoteEntry(m.merger, d); e != nil {
		return e, nil
	}
	return held, nil // an invalid runtime entry runs nowhere
}

// remoteEntry is d, a runtime entry of a shard this replica does not
// lead, parsed as that shard's leader's merger parses it; nil when it is
// invalid (it runs nowhere).
func remoteEntry(mg *sources.Merger, d sources.Doc) *config.Entry {
	e, err := mg.File().ParseEntry(d.Name, d.Data)
	if err != nil {
		return nil
	}
	e.Source = sources.API
	return e
}

// runsOver reports whether a runtime entry of a shard this replica does
// not lead runs in place of held, the entry another source defines
// under its name in the config this replica runs (nil: none): the shard's
// leader merges both, and the first in --sources-priority wins.
func runsOver(mg *sources.Merger, held *config.Entry) bool {
	return held == nil || mg.Outranks(sources.API, cmp.Or(held.Source, sources.File))
}

// remoteEntries is, for a page of /status on a sharded replica, the
// runtime entries of the shards it does not lead that the page may show:
// the first limit+1 whose names follow after and start with prefix (one
// range read of at most that many per shard), parsed as the merger parses
// them, less those whose name the config it runs gives to a source that
// outranks them (runsOver); and how many runtime entries of those shards
// follow in all (a count-only read per shard). So a page costs reads
// bounded by its size, whatever the cluster's.
func (m *Main) remoteEntries(ctx context.Context, after, prefix string, limit int) ([]*config.Entry, int, error) {
	held := m.runningConfig()
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
		if !runsOver(m.merger, held.Entry(d.Name)) {
			continue // another source's entry runs under that name
		}
		if e := remoteEntry(m.merger, d); e != nil {
			out = append(out, e)
		}
	}
	return out, total, nil
}
