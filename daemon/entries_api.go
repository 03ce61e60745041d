package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/etcdscan"
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
	// holds, on a sharded replica, says whether its merger holds shard
	// i's entries (sources.Merger.Holds): it holds the runtime entries of
	// those shards only.
	shards int
	holds  func(i int) bool
	// remoteDefs, on a sharded replica, is the definitions of entries of
	// shards it does not lead, each by --sources-priority, given their
	// stored runtime documents (Main.remoteDefs).
	remoteDefs func(ctx context.Context, names []string, docs map[string]sources.Doc) (map[string]*config.Entry, error)
}

// isRemote says whether the entry name runs on a shard another replica
// leads, whose runtime entries this one does not hold.
func (a *entriesAPI) isRemote(name string) bool {
	return a.holds != nil && !a.holds(keys.ShardOf(name, a.shards))
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
	if a.holds != nil {
		// The file's and django-celery-beat's entries of the shards
		// another replica leads, which this one indexes by name.
		unheld, _ := a.merger.Unheld(q.After, q.Prefix, q.Limit+1)
		for _, u := range unheld {
			running = append(running, u.Name)
		}
		slices.Sort(running)
		running = slices.Compact(running)
		if len(running) > q.Limit {
			running, more = running[:q.Limit], true
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
	return a.page(ctx, cfg, merged, docs, nil, more, "")
}

// page is the page of the entries named, in order (known: definitions of
// entries of other shards already resolved, see views); more says
// entries follow them, from after the last named, or from through when
// set (a filtered page that read the other shards' entries no further).
func (a *entriesAPI) page(ctx context.Context, cfg *config.Config, names []string, docs map[string]sources.Doc, known map[string]*config.Entry, more bool, through string) (api.Page, error) {
	list, err := a.views(ctx, cfg, names, docs, known)
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

// filterScanPages bounds a filtered page's reads of the entries of the
// shards another replica leads: at most this many times its limit names
// (plus a window per shard and one of the index). A filter that matches
// few of them ends its page there, with fewer entries than its limit
// (even none) and a next that goes on from the last name read.
const filterScanPages = 8

// filtered is a page of the running entries of q's task or queue: those
// of the config this replica runs, and, on a sharded replica, the entries
// of every source of the shards it does not lead (remoteFiltered), each
// defined as their shards' leaders define them.
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
	if a.holds != nil {
		if remote, through, err = a.remoteFiltered(ctx, cfg, q, match, docs); err != nil {
			return api.Page{}, err
		}
	}
	running := runningFiltered(cfg, q, match, through)
	var apiNames []string
	for _, e := range running {
		if e.Source == sources.API {
			apiNames = append(apiNames, e.Name)
		}
	}
	got, err := a.entries.GetMany(ctx, apiNames, etcdscan.ReadBatch)
	if err != nil {
		return api.Page{}, err
	}
	maps.Copy(docs, got)
	names := make([]string, 0, len(running)+len(remote))
	for _, e := range running {
		names = append(names, e.Name)
	}
	known := make(map[string]*config.Entry, len(remote))
	for _, e := range remote {
		names = append(names, e.Name)
		known[e.Name] = e
	}
	slices.Sort(names)
	more := false
	if len(names) > q.Limit {
		names, more, through = names[:q.Limit], true, ""
	}
	return a.page(ctx, cfg, names, docs, known, more, through)
}

// runningFiltered is the first q.Limit+1 entries of the config this
// replica runs that match, by name, up to through when set. On a sharded
// replica that config holds the shards it leads alone, so none of these
// is an entry of another shard (remoteFiltered leaves their names out).
func runningFiltered(cfg *config.Config, q api.ListQuery, match func(*config.Entry) bool, through string) []*config.Entry {
	if cfg == nil {
		return nil
	}
	var out []*config.Entry
	for e := range cfg.Following(q.After, q.Prefix) {
		if through != "" && e.Name > through {
			break
		}
		if match(e) {
			if out = append(out, e); len(out) > q.Limit {
				break
			}
		}
	}
	return out
}

// remoteFiltered is the entries of the shards this replica does not lead
// that run and match, by name: the names of each shard's runtime
// definitions, read in windows of q.Limit, and of the file's and
// django-celery-beat's entries the merger indexes but does not hold, q.Limit
// at a time, are merged by name; each name read is defined by
// --sources-priority as its shard's leader defines it (remoteDefs: one
// parse of the file and one django-celery-beat query per round, for the
// names those sources win), until q.Limit+1 match or filterScanPages
// times q.Limit names were read. through is "" when every name that
// follows q.After was read, else the last name read in order (every one
// up to it was, and none past it). docs gets the stored definitions of
// the runtime entries returned.
func (a *entriesAPI) remoteFiltered(ctx context.Context, cfg *config.Config, q api.ListQuery, match func(*config.Entry) bool, docs map[string]sources.Doc) ([]*config.Entry, string, error) {
	// A cursor reads one source of names in order: next gives the names
	// that follow after, and whether more follow them.
	type cursor struct {
		next  func(after string) ([]string, bool, error)
		buf   []string
		after string
		more  bool
	}
	stored := map[string]sources.Doc{}
	var curs []*cursor
	for i := range a.shards {
		if a.holds(i) {
			continue
		}
		st := a.entries.Shard(i)
		curs = append(curs, &cursor{after: q.After, more: true, next: func(after string) ([]string, bool, error) {
			win, more, err := st.Window(ctx, after, q.Prefix, q.Limit)
			names := make([]string, len(win))
			for j, d := range win {
				names[j], stored[d.Name] = d.Name, d
			}
			return names, more, err
		}})
	}
	curs = append(curs, &cursor{after: q.After, more: true, next: func(after string) ([]string, bool, error) {
		unheld, total := a.merger.Unheld(after, q.Prefix, q.Limit)
		names := make([]string, len(unheld))
		for j, u := range unheld {
			names[j] = u.Name
		}
		return names, total > len(unheld), nil
	}})
	var out []*config.Entry
	read := 0
	for {
		for _, c := range curs {
			if len(c.buf) > 0 || !c.more {
				continue
			}
			names, more, err := c.next(c.after)
			if err != nil {
				return nil, "", err
			}
			c.buf, c.more = names, more && len(names) > 0
			if len(names) > 0 {
				c.after = names[len(names)-1]
			}
		}
		// Every name up to the lowest last name read of a cursor with
		// more is read: those are taken, in name order, each once (the
		// index and a runtime definition may both have it).
		frontier, bounded := "", false
		for _, c := range curs {
			if c.more && (!bounded || c.after < frontier) {
				frontier, bounded = c.after, true
			}
		}
		var batch []string
		for _, c := range curs {
			k := len(c.buf)
			if bounded {
				k, _ = slices.BinarySearch(c.buf, frontier+"\x00")
			}
			batch, c.buf = append(batch, c.buf[:k]...), c.buf[k:]
		}
		slices.Sort(batch)
		batch = slices.Compact(batch)
		// A name the config this replica runs has (a shard it took or
		// lets go of meanwhile) is runningFiltered's.
		others := slices.DeleteFunc(slices.Clone(batch), func(name string) bool { return cfg != nil && cfg.Entry(name) != nil })
		defs, err := a.remoteDefs(ctx, others, stored)
		if err != nil {
			return nil, "", err
		}
		for _, name := range batch {
			read++
			if e := defs[name]; e != nil && match(e) {
				out = append(out, e)
				if d, ok := stored[name]; ok && e.Source == sources.API {
					docs[name] = d
				}
				if len(out) > q.Limit {
					return out, name, nil
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
	unheld := a.isRemote(name) && len(a.merger.Indexed(name)) > 0
	if len(docs) == 0 && (cfg == nil || cfg.Entry(name) == nil) && !unheld {
		return api.Entry{}, sources.ErrNotFound
	}
	list, err := a.views(ctx, cfg, []string{name}, docs, nil)
	if err != nil {
		return api.Entry{}, err
	}
	return list[0], nil
}

// views builds the entries named, in order: running ones from cfg or,
// of the shards another replica leads, from known or their definition
// by --sources-priority (remoteDefs); the others from their stored
// documents in docs (which also give running runtime entries their
// spec).
func (a *entriesAPI) views(ctx context.Context, cfg *config.Config, names []string, docs map[string]sources.Doc, known map[string]*config.Entry) ([]api.Entry, error) {
	var runningNames, others []string
	remote := map[string]*config.Entry{}
	for _, n := range names {
		switch {
		case cfg != nil && cfg.Entry(n) != nil:
			runningNames = append(runningNames, n)
		case !a.isRemote(n):
		case known[n] != nil:
			remote[n] = known[n]
		default:
			others = append(others, n)
		}
	}
	// An entry of a shard another replica leads runs there: its
	// definition as that replica's merger has it.
	if len(others) > 0 && a.remoteDefs != nil {
		defs, err := a.remoteDefs(ctx, others, docs)
		if err != nil {
			return nil, err
		}
		maps.Copy(remote, defs)
	}
	for _, n := range names {
		if remote[n] != nil {
			runningNames = append(runningNames, n)
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
		var e *config.Entry
		if cfg != nil {
			e = cfg.Entry(name)
		}
		if e == nil {
			e = remote[name]
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
		if a.merger.FileHas(d.Name) {
			if len(docs) == 1 {
				return 0, api.ErrFileOwned
			}
			return 0, fmt.Errorf("entry %q: %w", d.Name, api.ErrFileOwned)
		}
		// Stamped with when it is written: a leader that never stores a
		// baseline for it (one that stops before it sees the entry) is
		// followed by one that owes its slots from then.
		spec, err := config.StampDefinedAt(d.Spec, a.now())
		if err != nil {
			return 0, fmt.Errorf("entry %q: %w", d.Name, err)
		}
		e, err := file.ParseEntry(d.Name, spec)
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
		out = append(out, sources.Doc{Name: d.Name, Data: spec})
		a.merger.Prime(file, d.Name, spec, e)
	}
	if len(bad) > 0 {
		return 0, bad
	}
	return a.entries.Put(ctx, out, ifMatch)
}

// DeleteEntry implements api.EntriesBackend.
func (a *entriesAPI) DeleteEntry(ctx context.Context, name string, ifMatch int64) error {
	if a.merger.FileHas(name) {
		return api.ErrFileOwned
	}
	return a.entries.Delete(ctx, name, ifMatch)
}
