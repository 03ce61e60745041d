package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/upcoming"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// entriesAPI implements api.EntriesBackend over the merged config, the
// runtime entries in etcd, the state table and the run history.
type entriesAPI struct {
	cli     *clientv3.Client
	prefix  string
	merger  *sources.Merger
	entries *sources.Entries
	hist    outcome.History // may be nil
	now     func() time.Time
	// shards is the cluster's shard count (0 or 1: unsharded), and
	// leads, on a sharded replica, says whether it leads shard i (it
	// holds the runtime entries of those shards only).
	shards int
	leads  func(i int) bool
}

// isRemote says whether the entry name runs on a shard another replica
// leads, whose runtime entries this one does not hold.
func (a *entriesAPI) isRemote(name string) bool {
	return a.leads != nil && !a.leads(keys.ShardOf(name, a.shards))
}

// nextRunsShown is how many coming fire times the entries API lists.
const nextRunsShown = 3

// ListEntries implements api.EntriesBackend: a page of the running
// entries of every source and of the runtime entries that are not
// running (and why), in name order. Without a task or queue filter the
// page merges the running set with one range read of the stored runtime
// entries over the same names; with one, it holds the running entries
// that match (a runtime entry that does not run has no task to match),
// those of the shards another replica leads included (filtered).
func (a *entriesAPI) ListEntries(ctx context.Context, q api.ListQuery) (api.Page, error) {
	cfg := a.merger.Current()
	if q.Task != "" || q.Queue != "" {
		return a.filtered(ctx, cfg, q)
	}
	var running []string
	more := false
	if cfg != nil {
		for e := range cfg.Following(q.After, q.Prefix) {
			if len(running) == q.Limit {
				more = true
				break
			}
			running = append(running, e.Name)
		}
	}
	win, winMore, err := a.entries.Window(ctx, q.After, q.Prefix, q.Limit)
	if err != nil {
		return api.Page{}, err
	}
	docs := make(map[string]sources.Doc, len(win))
	merged := make([]string, 0, len(running)+len(win))
	i := 0
	for _, d := range win {
		docs[d.Name] = d
		for i < len(running) && running[i] < d.Name {
			merged = append(merged, running[i])
			i++
		}
		if i < len(running) && running[i] == d.Name {
			i++
		}
		merged = append(merged, d.Name)
	}
	if winMore && len(win) > 0 {
		// Stored entries past the window are unread: the page ends
		// where the window does.
		more = true
	} else {
		merged = append(merged, running[i:]...)
	}
	if len(merged) > q.Limit {
		merged, more = merged[:q.Limit], true
	}
	return a.page(ctx, cfg, merged, docs, more, "")
}

// page is the page of the entries named, in order; more says entries
// follow them, from after the last named, or from through when set (a
// filtered page that read the other shards' entries no further).
func (a *entriesAPI) page(ctx context.Context, cfg *config.Config, names []string, docs map[string]sources.Doc, more bool, through string) (api.Page, error) {
	list, err := a.views(ctx, cfg, names, docs)
	if err != nil {
		return api.Page{}, err
	}
	page := api.Page{Entries: list}
	switch {
	case more && len(names) > 0:
		page.Next = names[len(names)-1]
	case through != "":
		page.Next = through
	}
	return page, nil
}

// filterScanPages bounds a filtered page's reads of the runtime entries
// of the shards another replica leads: at most this many times its limit
// (plus a window per shard). A filter that matches few of them ends its
// page there, with fewer entries than its limit (even none) and a next
// that goes on from the last name read.
const filterScanPages = 8

// filtered is a page of the running entries of q's task or queue: those
// of the config this replica runs, and, on a sharded replica, the runtime
// entries of the shards it does not lead, read from etcd in name order
// (in windows of q.Limit per shard, at most filterScanPages times
// q.Limit) and parsed as their shards' leaders parse them.
func (a *entriesAPI) filtered(ctx context.Context, cfg *config.Config, q api.ListQuery) (api.Page, error) {
	match := func(e *config.Entry) bool {
		return (q.Task == "" || e.Task == q.Task) && (q.Queue == "" || e.Options != nil && e.Options.Queue == q.Queue)
	}
	var (
		remote  []*config.Entry
		docs    = map[string]sources.Doc{}
		through string
		err     error
	)
	if a.leads != nil {
		if remote, through, err = a.remoteFiltered(ctx, cfg, q, match, docs); err != nil {
			return api.Page{}, err
		}
	}
	running, err := a.runningFiltered(ctx, cfg, q, match, through)
	if err != nil {
		return api.Page{}, err
	}
	var apiNames []string
	for _, e := range running {
		if e.Source == sources.API {
			apiNames = append(apiNames, e.Name)
		}
	}
	got, err := a.entries.GetMany(ctx, apiNames, store.ReadBatch)
	if err != nil {
		return api.Page{}, err
	}
	maps.Copy(docs, got)
	names := make([]string, 0, len(running)+len(remote))
	for _, e := range running {
		names = append(names, e.Name)
	}
	for _, e := range remote {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	more := false
	if len(names) > q.Limit {
		names, more, through = names[:q.Limit], true, ""
	}
	return a.page(ctx, cfg, names, docs, more, through)
}

// runningFiltered is the first q.Limit+1 entries of the config this
// replica runs that match, by name, up to through when set; an entry of a
// shard it does not lead that a runtime entry there runs over (runsOver)
// is left out, the runtime entry being the one that runs.
func (a *entriesAPI) runningFiltered(ctx context.Context, cfg *config.Config, q api.ListQuery, match func(*config.Entry) bool, through string) ([]*config.Entry, error) {
	if cfg == nil {
		return nil, nil
	}
	var out, maybe []*config.Entry
	// settle drops the entries of maybe that a runtime entry of their
	// shard runs over: one read of their names.
	settle := func() error {
		if len(maybe) == 0 {
			return nil
		}
		names := make([]string, len(maybe))
		for i, e := range maybe {
			names[i] = e.Name
		}
		docs, err := a.entries.GetMany(ctx, names, store.ReadBatch)
		if err != nil {
			return err
		}
		kept := out[:0]
		for _, e := range out {
			if d, ok := docs[e.Name]; !ok || remoteEntry(a.merger, d) == nil {
				kept = append(kept, e)
			}
		}
		out, maybe = kept, maybe[:0]
		return nil
	}
	for e := range cfg.Following(q.After, q.Prefix) {
		if through != "" && e.Name > through {
			break
		}
		if !match(e) {
			continue
		}
		out = append(out, e)
		if a.isRemote(e.Name) && runsOver(a.merger, e) {
			maybe = append(maybe, e)
		}
		if len(out) > q.Limit {
			if err := settle(); err != nil {
				return nil, err
			}
			if len(out) > q.Limit {
				break
			}
		}
	}
	return out, settle()
}

// remoteFiltered is the runtime entries of the shards this replica does
// not lead that run and match, by name: each shard's definitions are read
// in windows of q.Limit and merged by name, until q.Limit+1 match or
// filterScanPages times q.Limit were read. through is "" when every
// definition that follows q.After was read, else the last name read in
// order (every one up to it was, and none past it). docs gets the
// definitions of the entries returned.
func (a *entriesAPI) remoteFiltered(ctx context.Context, cfg *config.Config, q api.ListQuery, match func(*config.Entry) bool, docs map[string]sources.Doc) ([]*config.Entry, string, error) {
	type cursor struct {
		st    *sources.Entries
		buf   []sources.Doc
		after string
		more  bool
	}
	var curs []*cursor
	for i := range a.shards {
		if !a.leads(i) {
			curs = append(curs, &cursor{st: a.entries.Shard(i), after: q.After, more: true})
		}
	}
	var out []*config.Entry
	read := 0
	for {
		for _, c := range curs {
			if len(c.buf) > 0 || !c.more {
				continue
			}
			win, more, err := c.st.Window(ctx, c.after, q.Prefix, q.Limit)
			if err != nil {
				return nil, "", err
			}
			c.buf, c.more = win, more && len(win) > 0
			if len(win) > 0 {
				c.after = win[len(win)-1].Name
			}
		}
		// Every definition up to the lowest last name read of a shard
		// with more is read: those are taken, in name order.
		frontier, bounded := "", false
		for _, c := range curs {
			if c.more && (!bounded || c.after < frontier) {
				frontier, bounded = c.after, true
			}
		}
		var batch []sources.Doc
		for _, c := range curs {
			k := len(c.buf)
			if bounded {
				k, _ = slices.BinarySearchFunc(c.buf, frontier, func(d sources.Doc, name string) int {
					if d.Name <= name {
						return -1
					}
					return 1
				})
			}
			batch, c.buf = append(batch, c.buf[:k]...), c.buf[k:]
		}
		slices.SortFunc(batch, func(x, y sources.Doc) int { return strings.Compare(x.Name, y.Name) })
		for _, d := range batch {
			read++
			var held *config.Entry
			if cfg != nil {
				held = cfg.Entry(d.Name)
			}
			if !runsOver(a.merger, held) {
				continue // another source's entry runs under that name
			}
			if e := remoteEntry(a.merger, d); e != nil && match(e) {
				out = append(out, e)
				docs[d.Name] = d
				if len(out) > q.Limit {
					return out, d.Name, nil
				}
			}
		}
		if !bounded {
			return out, "", nil
		}
		if read >= filterScanPages*q.Limit {
			return out, frontier, nil
		}
	}
}

// GetEntry implements api.EntriesBackend.
func (a *entriesAPI) GetEntry(ctx context.Context, name string) (api.Entry, error) {
	docs := map[string]sources.Doc{}
	d, err := a.entries.Get(ctx, name)
	if err != nil && !errors.Is(err, sources.ErrNotFound) {
		return api.Entry{}, err
	}
	if err == nil {
		docs[d.Name] = d
	}
	cfg := a.merger.Current()
	if len(docs) == 0 && (cfg == nil || cfg.Entry(name) == nil) {
		return api.Entry{}, sources.ErrNotFound
	}
	list, err := a.views(ctx, cfg, []string{name}, docs)
	if err != nil {
		return api.Entry{}, err
	}
	return list[0], nil
}

// views builds the entries named, in order: running ones from cfg, the
// others from their stored documents in docs (which also give running
// runtime entries their spec).
func (a *entriesAPI) views(ctx context.Context, cfg *config.Config, names []string, docs map[string]sources.Doc) ([]api.Entry, error) {
	var runningNames []string
	for _, n := range names {
		if cfg != nil && cfg.Entry(n) != nil {
			runningNames = append(runningNames, n)
		}
	}
	remote := map[string]*config.Entry{}
	for _, n := range names {
		d, ok := docs[n]
		if !ok || !a.isRemote(n) {
			continue
		}
		// A runtime entry of a shard another replica leads runs there,
		// unless the config this replica runs gives its name to a source
		// that outranks it: parsed from its document as that replica's
		// merger parses it.
		var held *config.Entry
		if cfg != nil {
			held = cfg.Entry(n)
		}
		if !runsOver(a.merger, held) {
			continue
		}
		if e := remoteEntry(a.merger, d); e != nil {
			remote[n] = e
			if held == nil {
				runningNames = append(runningNames, n)
			}
		}
	}
	states, err := a.statesOf(ctx, runningNames)
	if err != nil {
		return nil, err
	}
	var runs map[string]outcome.EntryRuns
	if a.hist != nil && len(runningNames) > 0 {
		runs, _ = a.hist.Histories(ctx, runningNames) // a broker that does not answer leaves the runs out
	}
	now := a.now()
	invalid := map[string]string{}
	for _, h := range a.merger.Health() {
		if h.Source == sources.API {
			invalid = h.Invalid
		}
	}
	out := make([]api.Entry, 0, len(names))
	for _, name := range names {
		e := remote[name]
		if e == nil && cfg != nil {
			e = cfg.Entry(name)
		}
		if e == nil {
			d := docs[name]
			v := api.Entry{Name: name, Source: sources.API, Spec: json.RawMessage(d.Data), ModRevision: d.ModRevision,
				NextRuns: []time.Time{}, LastRuns: []outcome.Run{}}
			if invalid[name] != "" {
				v.Problem = "invalid: " + invalid[name]
			} else {
				v.Problem = "not applied yet"
			}
			out = append(out, v)
			continue
		}
		st := states[name]
		f := status.Facts{Name: name, Entry: e, State: st, Cluster: keys.Cluster(a.prefix)}
		if h, ok := runs[name]; ok {
			f.History = &h
		}
		es := status.Of(f, now)
		v := api.Entry{Name: name, Source: es.Source, Active: true, Task: es.Task, Schedule: es.Schedule, Workflow: es.Workflow,
			Enabled: es.Enabled, Paused: es.Paused, Outcomes: es.Outcomes, NextRuns: []time.Time{}, LastRuns: es.RecentRuns}
		if e.Enabled && !v.Paused {
			v.NextRuns = append(v.NextRuns, upcoming.Slots(e, st, now, nextRunsShown)...)
		}
		d, stored := docs[name]
		if stored && e.Source == sources.API {
			v.Spec, v.ModRevision = json.RawMessage(d.Data), d.ModRevision
		}
		out = append(out, v)
		if stored && e.Source != sources.API {
			// The stored runtime entry another source shadows, next to
			// the entry that runs.
			out = append(out, api.Entry{Name: name, Source: sources.API, Spec: json.RawMessage(d.Data), ModRevision: d.ModRevision,
				NextRuns: []time.Time{}, LastRuns: []outcome.Run{},
				Problem: "shadowed: source " + e.Source + " owns this name (see --sources-priority)"})
		}
	}
	return out, nil
}

// statesOf reads the state of the entries named from their shards'
// state tables (the cluster's one when unsharded).
func (a *entriesAPI) statesOf(ctx context.Context, names []string) (map[string]*store.EntryState, error) {
	n := max(a.shards, 1)
	byShard := make([][]string, n)
	for _, name := range names {
		i := keys.ShardOf(name, n)
		byShard[i] = append(byShard[i], name)
	}
	out := map[string]*store.EntryState{}
	for i, part := range byShard {
		if len(part) == 0 && n > 1 {
			continue
		}
		states, err := store.New(a.cli, keys.Shard(a.prefix, i, n)).StatesOf(ctx, part)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, states)
	}
	return out, nil
}

// PutEntries implements api.EntriesBackend: every document is validated
// by the rules of schedules.yaml with its defaults, no name may belong to
// the file, and all are written in one etcd transaction.
func (a *entriesAPI) PutEntries(ctx context.Context, docs []api.EntryDoc, ifMatch map[string]int64) (int64, error) {
	file := a.merger.File()
	bad := api.DocErrors{}
	out := make([]sources.Doc, 0, len(docs))
	for _, d := range docs {
		if file != nil && file.Entry(d.Name) != nil {
			if len(docs) == 1 {
				return 0, api.ErrFileOwned
			}
			return 0, fmt.Errorf("entry %q: %w", d.Name, api.ErrFileOwned)
		}
		e, err := file.ParseEntry(d.Name, d.Spec)
		if err == nil {
			if verr := scheduler.ValidateEntry(e); verr != nil {
				err = config.FieldErrors{{Pointer: "", Message: verr.Error()}}
			}
		}
		if err != nil {
			var fe config.FieldErrors
			if !errors.As(err, &fe) {
				fe = config.FieldErrors{{Pointer: "", Message: err.Error()}}
			}
			bad[d.Name] = fe
			continue
		}
		out = append(out, sources.Doc{Name: d.Name, Data: d.Spec})
		a.merger.Prime(file, d.Name, d.Spec, e)
	}
	if len(bad) > 0 {
		return 0, bad
	}
	return a.entries.Put(ctx, out, ifMatch)
}

// DeleteEntry implements api.EntriesBackend.
func (a *entriesAPI) DeleteEntry(ctx context.Context, name string, ifMatch int64) error {
	if file := a.merger.File(); file != nil && file.Entry(name) != nil {
		return api.ErrFileOwned
	}
	return a.entries.Delete(ctx, name, ifMatch)
}
