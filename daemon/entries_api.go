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
	// remote, on a sharded replica, says whether an entry runs on a shard
	// another replica leads, whose runtime entries this one does not hold.
	shards int
	remote func(name string) bool
	// remoteDefs, on a sharded replica, is the definitions of entries of
	// shards it does not lead, each by --sources-priority, given their
	// stored runtime documents (Main.remoteDefs).
	remoteDefs func(ctx context.Context, names []string, docs map[string]sources.Doc) (map[string]*config.Entry, error)
}

// nextRunsShown is how many coming fire times the entries API lists.
const nextRunsShown = 3

// ListEntries implements api.EntriesBackend: a page of the running
// entries of every source and of the runtime entries that are not
// running (and why), in name order. Without a task or queue filter the
// page merges the running set with one range read of the stored runtime
// entries over the same names; with one, it holds the running entries
// that match (a runtime entry that does not run has no task to match).
func (a *entriesAPI) ListEntries(ctx context.Context, q api.ListQuery) (api.Page, error) {
	cfg := a.merger.Current()
	filtered := q.Task != "" || q.Queue != ""
	var running []string
	more := false
	if cfg != nil {
		for e := range cfg.Following(q.After, q.Prefix) {
			if q.Task != "" && e.Task != q.Task || q.Queue != "" && (e.Options == nil || e.Options.Queue != q.Queue) {
				continue
			}
			if len(running) == q.Limit {
				more = true
				break
			}
			running = append(running, e.Name)
		}
	}
	if !filtered && a.remote != nil {
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
	var (
		names = running
		docs  map[string]sources.Doc
		err   error
	)
	if filtered {
		var apiNames []string
		for _, n := range running {
			if cfg.Entry(n).Source == sources.API {
				apiNames = append(apiNames, n)
			}
		}
		if docs, err = a.entries.GetMany(ctx, apiNames, etcdscan.ReadBatch); err != nil {
			return api.Page{}, err
		}
	} else {
		win, winMore, err := a.entries.Window(ctx, q.After, q.Prefix, q.Limit)
		if err != nil {
			return api.Page{}, err
		}
		docs = make(map[string]sources.Doc, len(win))
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
		names = merged
	}
	list, err := a.views(ctx, cfg, names, docs)
	if err != nil {
		return api.Page{}, err
	}
	page := api.Page{Entries: list}
	if more && len(names) > 0 {
		page.Next = names[len(names)-1]
	}
	return page, nil
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
	unheld := a.remote != nil && a.remote(name) && len(a.merger.Indexed(name)) > 0
	if len(docs) == 0 && (cfg == nil || cfg.Entry(name) == nil) && !unheld {
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
	var others []string
	for _, n := range names {
		if cfg != nil && cfg.Entry(n) != nil || a.remote == nil || !a.remote(n) {
			continue
		}
		others = append(others, n)
	}
	// An entry of a shard another replica leads runs there: its
	// definition as that replica's merger has it.
	remote := map[string]*config.Entry{}
	if len(others) > 0 && a.remoteDefs != nil {
		var err error
		if remote, err = a.remoteDefs(ctx, others, docs); err != nil {
			return nil, err
		}
		for _, n := range others {
			if remote[n] != nil {
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
	if a.merger.FileHas(name) {
		return api.ErrFileOwned
	}
	return a.entries.Delete(ctx, name, ifMatch)
}
