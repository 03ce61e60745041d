package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/etcdscan"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/sources"
)

// shardDefsLoadTimeout bounds the range read of one shard's runtime
// entries at the start of its term.
const shardDefsLoadTimeout = time.Minute

// shardDefs loads shard i's entries ahead of a campaign for the shard
// (shardSet.prepare), so its term's scheduler starts with them (and the
// state of none of them is taken for a removed entry's): its entries of
// the file, parsed from the bytes of the file
// the merger runs (config.CheckPart, under reloadMu so a reload cannot
// come between); its django-celery-beat rows, in one read of the table;
// and its runtime entries, in one range read of its definitions
// (keys.Defs of its shard prefix), followed by one watch from that
// revision. Until the returned stop, which ends the watch and drops them
// all, the merger holds the shard's entries of every source (its reloads
// and dcb polls keep them), so a replica holds the entries of the shards
// it leads and, of the others, only their names.
func (m *Main) shardDefs(ctx context.Context, i int) (stop func(), err error) {
	part := m.merger.ShardPart(i)
	start := m.clock.Now()
	drop := func() {
		if err := part.Drop(); err != nil {
			m.log.Error("dropping a shard's entries failed", "shard", i, "err", err)
		}
	}
	m.reloadMu.Lock()
	part.Hold()
	file, err := config.CheckPart(m.ConfigPath, m.fileData, m.configOptions(), part.Has)
	if err == nil {
		err = part.SetFile(file)
	}
	m.reloadMu.Unlock()
	if err != nil {
		drop()
		return nil, fmt.Errorf("shard %d: load the file's entries: %w", i, err)
	}
	if src := m.Sources.dcb; src != nil {
		// A database that does not answer does not stop the shard, as
		// it does not stop a replica's start: the shard runs without
		// them, readiness says so, and the next poll reads them.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		docs, _, err := src.ReadPart(rctx, part.Has)
		cancel()
		if err == nil {
			err = part.SetSource(sources.DCB, docs)
		}
		if err != nil {
			src.Stale()
			m.merger.SetError(sources.DCB, fmt.Errorf("%s: shard %d: %w", src, i, err))
		}
	}
	st := m.entries.Shard(i)
	lctx, cancel := context.WithTimeout(ctx, shardDefsLoadTimeout)
	rev, err := st.Load(lctx, part)
	cancel()
	if err != nil {
		drop()
		return nil, fmt.Errorf("shard %d: read runtime entries: %w", i, err)
	}
	m.log.Info("shard's entries loaded", "shard", i, "took", m.clock.Since(start).String())
	wctx, cancelWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { st.Sync(wctx, part, rev) })
	return func() {
		cancelWatch()
		wg.Wait()
		if m.shards != nil && m.shards.draining.Load() {
			// The replica exits once its shards are handed over: a
			// drop would only rebuild its merged config (~1 s of CPU at
			// 56,000 entries) while the shard's new leader, on the same
			// host or etcd, starts it.
			return
		}
		drop()
	}, nil
}

// runningConfig is the config this replica runs: the scheduler's on an
// unsharded replica; on a sharded one the merger's (the entries of every
// source of the shards it leads), which its shards' schedulers hold in
// parts and no scheduler holds whole.
func (m *Main) runningConfig() *config.Config {
	if m.Shards > 1 {
		return m.merger.Current()
	}
	return m.sched.Config()
}

// entryOf is the definition of the entry named, wherever it runs: from
// the config this replica runs, else, on a sharded replica, from the
// sources of a shard it does not lead, by --sources-priority: the file's
// and django-celery-beat's by the merger's index, the runtime entries
// read from etcd, each parsed as the merger parses them (nil: no such
// entry).
func (m *Main) entryOf(ctx context.Context, name string) (*config.Entry, error) {
	if e := m.runningConfig().Entry(name); e != nil || m.Shards <= 1 {
		return e, nil
	}
	indexed := m.merger.Indexed(name)
	for _, src := range m.Sources.priority {
		if src != sources.API {
			if !slices.Contains(indexed, src) {
				continue
			}
			defs, err := m.unheldEntries(ctx, []sources.Named{{Name: name, Source: src}})
			if e := defs[name]; e != nil || err != nil {
				return e, err
			}
			continue
		}
		d, err := m.entries.Get(ctx, name)
		if errors.Is(err, sources.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if e := m.parseRemote(name, d.Data, sources.API); e != nil {
			return e, nil
		}
	}
	return nil, nil
}

// parseRemote parses a document of source as the merger parses it (nil:
// invalid, so it runs nowhere).
func (m *Main) parseRemote(name string, doc []byte, source string) *config.Entry {
	e, err := m.merger.File().ParseEntry(name, doc)
	if err == nil {
		err = scheduler.ValidateEntry(e)
	}
	if err != nil {
		return nil
	}
	e.Source = source
	return e
}

// unheldEntries parses the entries named, of the file or
// django-celery-beat and of shards this replica does not lead, which its
// merger indexes but does not hold: the file's from the bytes of the file
// it runs (config.CheckPart of those names), dcb's in one query by name.
// A dcb that does not answer leaves its entries out (its health says
// so).
func (m *Main) unheldEntries(ctx context.Context, named []sources.Named) (map[string]*config.Entry, error) {
	out := map[string]*config.Entry{}
	want := map[string]string{}
	var dcbNames []string
	for _, n := range named {
		want[n.Name] = n.Source
		if n.Source == sources.DCB {
			dcbNames = append(dcbNames, n.Name)
		}
	}
	if len(dcbNames) < len(named) {
		m.reloadMu.Lock()
		data := m.fileData
		m.reloadMu.Unlock()
		file, err := config.CheckPart(m.ConfigPath, data, m.configOptions(),
			func(name string) bool { return want[name] == sources.File })
		if err != nil {
			return nil, fmt.Errorf("parse the file's entries of other shards: %w", err)
		}
		for _, e := range file.Entries {
			if scheduler.ValidateEntry(e) == nil {
				e.Source = sources.File
				out[e.Name] = e
			}
		}
	}
	if src := m.Sources.dcb; src != nil && len(dcbNames) > 0 {
		docs, _, err := src.ReadNames(ctx, dcbNames)
		if err != nil {
			m.log.Warn("reading django-celery-beat entries of other shards failed; left out", "err", err)
		}
		for name, doc := range docs {
			if e := m.parseRemote(name, doc, sources.DCB); e != nil {
				out[name] = e
			}
		}
	}
	return out, nil
}

// remoteEntries is, for a page of /status on a sharded replica, the
// entries of the shards it does not lead that the page may show: the
// first limit+1 whose names follow after and start with prefix, less the
// names of the config it runs, of the runtime entries (one range read of
// at most that many per shard) and of the file's and django-celery-beat's
// names the merger indexes, each name by --sources-priority, parsed as
// the merger parses them (unheldEntries); and how many entries of those
// shards follow in all (a count-only read per shard, and the index's). So
// a page costs reads bounded by its size, whatever the cluster's (but for
// the file's, whose YAML is read whole to parse the page's few).
func (m *Main) remoteEntries(ctx context.Context, after, prefix string, limit int) ([]*config.Entry, int, error) {
	held := m.runningConfig()
	var (
		docs     []sources.Doc
		total    int
		unheldAt []*sources.Entries // the runtime entries of the shards not led
	)
	for i := range m.Shards {
		if m.merger.Holds(i) {
			continue // its entries are in held (and not in the index's Unheld)
		}
		st := m.entries.Shard(i)
		unheldAt = append(unheldAt, st)
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
	unheld, n := m.merger.Unheld(after, prefix, limit+1)
	var twice []string
	exact := true
	if n > 0 && total > 0 {
		// A name that a runtime entry and the file or dcb both define
		// is one entry, counted by both.
		var err error
		if twice, exact, err = m.definedTwice(ctx, unheldAt, after, prefix, n, total); err != nil {
			return nil, 0, err
		}
		total -= len(twice)
	}
	if after == "" && prefix == "" {
		// Every such name of the shards not led: their conflicts, which
		// only their leaders' mergers see (none known past the bounds).
		var c []sources.Conflict
		if exact {
			c = m.conflictsOf(twice)
		}
		m.remoteConflicts.Store(&c)
	}
	total += n
	// Each name once, from the source that wins it.
	rank := func(src string) int { return slices.Index(m.Sources.priority, src) }
	won := map[string]string{}
	runtime := map[string][]byte{}
	for _, d := range docs {
		won[d.Name], runtime[d.Name] = sources.API, d.Data
	}
	for _, u := range unheld {
		if src, ok := won[u.Name]; !ok || rank(u.Source) < rank(src) {
			won[u.Name] = u.Source
		}
	}
	names := slices.Sorted(maps.Keys(won))
	names = slices.DeleteFunc(names, func(name string) bool { return held.Entry(name) != nil })
	names = names[:min(len(names), limit+1)]
	var indexed []sources.Named
	for _, name := range names {
		if won[name] != sources.API {
			indexed = append(indexed, sources.Named{Name: name, Source: won[name]})
		}
	}
	defs, err := m.unheldEntries(ctx, indexed)
	if err != nil {
		return nil, 0, err
	}
	out := make([]*config.Entry, 0, len(names))
	for _, name := range names {
		e := defs[name]
		if won[name] == sources.API {
			e = m.parseRemote(name, runtime[name], sources.API)
		}
		if e != nil { // an invalid entry runs nowhere
			out = append(out, e)
		}
	}
	return out, total, nil
}

// The reads that find the names both a runtime entry and an indexed
// source define, among the shards a replica does not lead
// (definedTwice), are bounded: a default /status refreshes its total with
// them. The index's names are looked up by name, 16 a transaction, up to
// overlapByName of them; the runtime names are read keys-only, 5,000 a
// read, up to overlapByScan. Past both, a page's total counts such a name
// twice (docs/shards.md).
const (
	overlapByName = 2_000
	overlapByScan = 50_000
)

// definedTwice is the names, following after and starting with prefix,
// that a runtime entry of the stores unheld and the file or dcb (the
// merger's index) both define, given indexed of the index's and runtime
// of the runtime entries'; exact is false past both bounds, where none is
// read. It reads the cheaper side within its bound: the indexed names'
// runtime keys by name, or the runtime names keys-only.
func (m *Main) definedTwice(ctx context.Context, unheld []*sources.Entries, after, prefix string, indexed, runtime int) (names []string, exact bool, err error) {
	switch {
	case indexed <= overlapByName && (indexed <= runtime || runtime > overlapByScan):
		named, _ := m.merger.Unheld(after, prefix, indexed)
		all := make([]string, len(named))
		for i, n := range named {
			all[i] = n.Name
		}
		got, err := m.entries.GetMany(ctx, all, etcdscan.ReadBatch)
		if err != nil {
			return nil, false, fmt.Errorf("find the names defined twice: %w", err)
		}
		return slices.Sorted(maps.Keys(got)), true, nil
	case runtime <= overlapByScan:
		for _, st := range unheld {
			if err := st.Names(ctx, after, prefix, func(name string) {
				if len(m.merger.Indexed(name)) > 0 {
					names = append(names, name)
				}
			}); err != nil {
				return nil, false, fmt.Errorf("find the names defined twice: %w", err)
			}
		}
		slices.Sort(names)
		return names, true, nil
	}
	return nil, false, nil
}

// conflictsOf is the conflicts of names that a runtime entry and an
// indexed source both define, each won by --sources-priority.
func (m *Main) conflictsOf(names []string) []sources.Conflict {
	out := make([]sources.Conflict, 0, len(names))
	for _, name := range names {
		has := m.merger.Indexed(name)
		var srcs []string
		for _, src := range m.Sources.priority {
			if src == sources.API || slices.Contains(has, src) {
				srcs = append(srcs, src)
			}
		}
		out = append(out, sources.Conflict{Name: name, Winner: srcs[0], Sources: srcs})
	}
	return out
}

// conflicts is every conflict this replica knows: its merger's (the
// shards it leads, and the file's and dcb's names of the others), and
// those of runtime entries of the shards it does not lead, as the last
// whole-range count of /status found them (remoteEntries). A name in both
// is the latter's, which names every source.
func (m *Main) conflicts() []sources.Conflict {
	out := m.merger.Conflicts()
	remote := m.remoteConflicts.Load()
	if remote == nil || len(*remote) == 0 {
		return out
	}
	out = slices.DeleteFunc(out, func(c sources.Conflict) bool {
		_, found := slices.BinarySearchFunc(*remote, c.Name, func(r sources.Conflict, name string) int { return strings.Compare(r.Name, name) })
		return found
	})
	out = append(out, *remote...)
	slices.SortFunc(out, func(a, b sources.Conflict) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// remoteDefs is, for the entries API on a sharded replica, the
// definitions of the entries named, of shards it does not lead, each by
// --sources-priority: the file's and django-celery-beat's by the
// merger's index (unheldEntries), the runtime entries' from their stored
// documents in docs. A name none defines validly is left out.
func (m *Main) remoteDefs(ctx context.Context, names []string, docs map[string]sources.Doc) (map[string]*config.Entry, error) {
	var indexed []sources.Named
	winners := map[string]string{}
	for _, name := range names {
		has := m.merger.Indexed(name)
		for _, src := range m.Sources.priority {
			_, stored := docs[name]
			if src == sources.API && stored || slices.Contains(has, src) {
				winners[name] = src
				break
			}
		}
		if src := winners[name]; src != "" && src != sources.API {
			indexed = append(indexed, sources.Named{Name: name, Source: src})
		}
	}
	out, err := m.unheldEntries(ctx, indexed)
	if err != nil {
		return nil, err
	}
	for name, src := range winners {
		if src == sources.API {
			if e := m.parseRemote(name, docs[name].Data, sources.API); e != nil {
				out[name] = e
			}
		}
	}
	return out, nil
}
