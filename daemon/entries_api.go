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
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/scheduler"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/broker"
	redisbroker "github.com/beatd/beatd/broker/redis"
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
	hist    HistoryReader // may be nil
	now     func() time.Time
}

// nextRunsShown is how many coming fire times the entries API lists.
const nextRunsShown = 3

// ListEntries implements api.EntriesBackend: every running entry of every
// source, then the runtime entries that are not running, and why.
func (a *entriesAPI) ListEntries(ctx context.Context) ([]api.Entry, error) {
	return a.views(ctx, nil)
}

// GetEntry implements api.EntriesBackend.
func (a *entriesAPI) GetEntry(ctx context.Context, name string) (api.Entry, error) {
	list, err := a.views(ctx, []string{name})
	if err != nil {
		return api.Entry{}, err
	}
	if len(list) == 0 {
		return api.Entry{}, sources.ErrNotFound
	}
	return list[0], nil
}

// views builds the entries named in only (all when nil).
func (a *entriesAPI) views(ctx context.Context, only []string) ([]api.Entry, error) {
	want := func(string) bool { return true }
	if only != nil {
		set := map[string]bool{}
		for _, n := range only {
			set[n] = true
		}
		want = func(n string) bool { return set[n] }
	}
	docs := map[string]sources.Doc{}
	if len(only) == 1 {
		d, err := a.entries.Get(ctx, only[0])
		if err != nil && !errors.Is(err, sources.ErrNotFound) {
			return nil, err
		}
		if err == nil {
			docs[d.Name] = d
		}
	} else {
		list, _, err := a.entries.List(ctx)
		if err != nil {
			return nil, err
		}
		for _, d := range list {
			if want(d.Name) {
				docs[d.Name] = d
			}
		}
	}
	cfg := a.merger.Current()
	var names []string
	if cfg != nil {
		for _, e := range cfg.Entries {
			if want(e.Name) {
				names = append(names, e.Name)
			}
		}
	}
	table, err := store.New(a.cli, a.prefix).Load(ctx)
	if err != nil {
		return nil, err
	}
	states := table.States()
	var runs map[string]redisbroker.History
	if a.hist != nil && len(names) > 0 {
		runs, _ = a.hist.Histories(ctx, names) // a broker that does not answer leaves the runs out
	}
	now := a.now()
	invalid := map[string]string{}
	for _, h := range a.merger.Health() {
		if h.Source == sources.API {
			invalid = h.Invalid
		}
	}
	var out []api.Entry
	for _, name := range names {
		e := cfg.Entry(name)
		v := api.Entry{Name: name, Source: e.Source, Active: true, Task: e.Task, Schedule: fmt.Sprint(e.Schedule),
			Enabled: e.Enabled, NextRuns: []time.Time{}, LastRuns: []broker.Run{}}
		st := states[name]
		if st != nil {
			v.Paused = st.Paused
			addOutcomes(&v.Outcomes, name, st.Out, keys.Cluster(a.prefix))
		}
		if h, ok := runs[name]; ok {
			v.LastRuns = append(v.LastRuns, h.Runs...)
		}
		if e.Enabled && !v.Paused {
			t, sched := now, scheduler.Anchored(e, st, now)
			for range nextRunsShown {
				if t = sched.Next(t); t.IsZero() {
					break
				}
				v.NextRuns = append(v.NextRuns, t)
			}
		}
		if d, ok := docs[name]; ok && e.Source == sources.API {
			v.Spec, v.ModRevision = json.RawMessage(d.Data), d.ModRevision
			delete(docs, name)
		}
		out = append(out, v)
	}
	// Runtime entries not running: shadowed by another source, invalid, or
	// not yet applied.
	for _, n := range slices.Sorted(maps.Keys(docs)) {
		d := docs[n]
		v := api.Entry{Name: n, Source: sources.API, Spec: json.RawMessage(d.Data), ModRevision: d.ModRevision,
			NextRuns: []time.Time{}, LastRuns: []broker.Run{}}
		switch {
		case invalid[n] != "":
			v.Problem = "invalid: " + invalid[n]
		case cfg != nil && cfg.Entry(n) != nil:
			v.Problem = "shadowed: source " + cfg.Entry(n).Source + " owns this name (see --sources-priority)"
		default:
			v.Problem = "not applied yet"
		}
		out = append(out, v)
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
