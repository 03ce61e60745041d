package status

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/upcoming"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Facts are what one entry's status is built from.
type Facts struct {
	Name string
	// Entry is its definition; nil for the state of an entry no longer
	// configured.
	Entry *config.Entry
	// State is its state from etcd; nil before the leader wrote one.
	State *store.EntryState
	// History is its runs from the broker's history; nil when none was
	// read.
	History *outcome.EntryRuns
	// Cluster names the task ids of runs recorded without one
	// (keys.Cluster of the prefix).
	Cluster string
}

// Of is the one builder of an entry's status: what its definition, its
// state and its run history say as of now. /status, `beatd status` and
// the console all take an entry's fields from it; the leader's live
// results are Overlay's.
func Of(f Facts, now time.Time) Entry {
	es := Entry{Name: f.Name}
	e, st := f.Entry, f.State
	if e != nil {
		es = definition(e)
	}
	es.RecentRuns = []outcome.Run{}
	if st != nil {
		es.Paused, es.LastSlot = st.Paused, timePtr(st.LastSlot)
		es.Outcomes = outcomesOf(f.Name, e, st.Out, f.Cluster)
	}
	if e != nil && e.HoldsOverlap() {
		es.Overlap = string(e.Overlap)
	}
	if h := f.History; h != nil {
		es.TotalRunCount, es.LastRunAt = h.Count, timePtr(h.LastRunAt())
		es.RecentRuns = append(es.RecentRuns, h.Runs...)
		es.LastFire = fireOf(h.Runs)
	}
	if e != nil {
		es.NextRunAt = timePtr(upcoming.Next(e, st, now))
		var left int
		es.Finished, left = upcoming.Finished(e, st, now)
		if left >= 0 {
			es.RemainingRuns = &left
		}
	}
	return es
}

// definition is the part of an entry's status its definition gives. An
// entry of the schedule file may have no source set: it is "file".
func definition(e *config.Entry) Entry {
	es := Entry{Name: e.Name, Source: cmp.Or(e.Source, sources.File), Task: e.Task,
		Schedule: fmt.Sprint(e.Schedule), ScheduleWords: schedule.Describe(e.Schedule), Enabled: e.Enabled, Templated: e.Templated()}
	if e.Canvas() != nil {
		es.Workflow = e.Workflow()
	}
	return es
}

// fireOf is the newest of runs (newest first), as the console shows a
// fire: "published", or "published (manual)" for a trigger's.
func fireOf(runs []outcome.Run) Fire {
	if len(runs) == 0 {
		return Fire{}
	}
	return Fire{At: runs[0].PublishedAt, Result: ResultWords(outcome.Published.String(), runs[0].Manual)}
}

// outcomesOf is what the workers reported about the runs of entry name,
// defined as e (nil once it left the config).
func outcomesOf(name string, e *config.Entry, o *store.Outcomes, cluster string) Outcomes {
	var es Outcomes
	if o == nil {
		return es
	}
	es.LastSuccessAt, es.LastFailureAt = timePtr(o.LastSuccess), timePtr(o.LastFailure)
	es.ConsecutiveFailures, es.PauseReason = o.Failures, o.PauseReason
	if n := o.Newest(); n != nil && !n.Kind.Finished() {
		es.Running = true
	}
	for _, r := range o.Runs {
		id := r.TaskID
		if id == "" {
			sid := celery.SlotIDOf(cluster, name, r.Slot)
			id = string(sid[:])
		}
		ro := RunOutcome{Slot: r.Slot, TaskID: id, Manual: r.Manual, Outcome: r.Kind.String(), PublishedAt: r.PublishedAt,
			StartedAt: timePtr(r.Started), UpdatedAt: timePtr(r.Updated), RuntimeSeconds: r.Runtime.Seconds(), Worker: r.Worker,
			Exception: r.ExcType, Message: r.ExcMsg}
		if r.Kind == outcome.Skipped {
			ro.TaskID, ro.SkippedSlots = "", max(r.Skips, 1)
		}
		if r.Chain > 0 && r.Kind != outcome.Skipped && r.Kind != outcome.Succeeded {
			ro.Step = config.StepWords(e, int(r.Chain), int(r.Step))
		}
		es.Runs = append(es.Runs, ro)
	}
	return es
}

// Build reads leadership and entry state from etcd, and the run history
// from the broker (hist may be nil), and builds the view of the entries
// of cfg that q selects (cfg may be nil: then only stored entries show).
// A broker that does not answer leaves the history out, not the view.
func Build(ctx context.Context, cli *clientv3.Client, prefix string, cfg *config.Config, hist outcome.History, now time.Time, q Query) (View, error) {
	var out View
	leader, err := election.Observe(ctx, cli, prefix)
	if err != nil && !errors.Is(err, election.ErrNoLeader) {
		return out, err
	}
	out.LeaderID, out.FencingToken = leader.ID, leader.Token
	sto := store.New(cli, prefix)
	tables, err := shardTables(ctx, cli, prefix, &out)
	if err != nil {
		return out, err
	}
	// A page of the config's entries, unless the whole of it fits in one:
	// then every stored state shows too, that of removed entries included.
	var page []*config.Entry
	if cfg != nil {
		for e := range cfg.Following(q.After, q.Prefix) {
			if out.EntriesTotal++; len(page) < q.Limit {
				page = append(page, e)
			}
		}
	}
	whole := cfg == nil || q.Prefix == "" && q.After == "" && len(cfg.Entries) <= q.Limit
	var states map[string]*store.EntryState
	if whole {
		if states, err = tables.all(ctx); err != nil {
			return out, err
		}
	} else {
		names := make([]string, len(page))
		for i, e := range page {
			names[i] = e.Name
		}
		if states, err = tables.of(ctx, names); err != nil {
			return out, err
		}
		if out.EntriesTotal > len(page) && len(page) > 0 {
			out.Next = page[len(page)-1].Name
		}
	}
	jobs, err := sto.Backfills(ctx)
	if err != nil {
		return out, err
	}
	for _, j := range jobs {
		if j.Unfinished() {
			out.Backfills = append(out.Backfills, j)
		}
	}
	var names []string
	for _, e := range page {
		names = append(names, e.Name)
	}
	if whole {
		for name := range states {
			if cfg == nil || cfg.Entry(name) == nil {
				names = append(names, name)
			}
		}
	}
	var runs map[string]outcome.EntryRuns
	if hist != nil {
		if runs, err = hist.Histories(ctx, names); err != nil {
			out.HistoryError = err.Error()
		}
	}
	cluster := keys.Cluster(prefix)
	seen := map[string]bool{}
	add := func(name string, e *config.Entry) {
		f := Facts{Name: name, Entry: e, State: states[name], Cluster: cluster}
		if h, ok := runs[name]; ok {
			f.History = &h
		}
		out.Entries = append(out.Entries, Of(f, now))
		seen[name] = true
	}
	for _, e := range page {
		add(e.Name, e)
	}
	if whole {
		for name := range states {
			if !seen[name] {
				add(name, nil)
			}
		}
		out.EntriesTotal = len(out.Entries)
	}
	return out, nil
}

// FromEtcd is Build plus the leader key's lease: a leader that stopped
// renewing it shows as unresponsive before it expires.
func FromEtcd(ctx context.Context, cli *clientv3.Client, prefix string, cfg *config.Config, hist outcome.History, now time.Time, q Query) (View, error) {
	st, err := Build(ctx, cli, prefix, cfg, hist, now, q)
	if err != nil || st.LeaderID == "" {
		return st, err
	}
	resp, err := cli.Get(ctx, keys.Leaders(prefix), clientv3.WithFirstCreate()...)
	if err != nil {
		return st, fmt.Errorf("status: leader lease: %w", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != st.FencingToken {
		return st, nil // changed meanwhile; the next read shows the new one
	}
	if lease := resp.Kvs[0].Lease; lease != 0 {
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(lease))
		if err != nil {
			return st, fmt.Errorf("status: leader lease: %w", err)
		}
		st.LeaderLeaseSeconds = max(ttl.TTL, 0)
		st.LeaderUnresponsive = leaseLapsing(ttl.TTL, ttl.GrantedTTL)
	}
	return st, nil
}

// leaseLapsing says a lease with remaining seconds left of granted was not
// renewed on time. The leader renews every granted/3, so a live lease
// keeps about 2/3 of its TTL or more; etcd truncates the remainder to
// whole seconds, hence one second of slack. With a TTL under 3s the
// slack leaves nothing to detect: such a leader just expires.
func leaseLapsing(remaining, granted int64) bool {
	return remaining < granted*2/3-1
}

// FromConfig is the view the config alone gives: its first DefaultLimit
// entries and their next run times, no state.
func FromConfig(cfg *config.Config, now time.Time) View {
	var st View
	if cfg == nil {
		return st
	}
	for _, e := range cfg.Entries[:min(len(cfg.Entries), DefaultLimit)] {
		es := definition(e)
		es.NextRunAt = timePtr(upcoming.Next(e, nil, now))
		st.Entries = append(st.Entries, es)
	}
	st.EntriesTotal = len(cfg.Entries)
	if len(st.Entries) < len(cfg.Entries) {
		st.Next = st.Entries[len(st.Entries)-1].Name
	}
	return st
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
