package daemon

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/leader"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/sources"
	"github.com/jonboulle/clockwork"

	"github.com/beatd/beatd/api"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// backend answers the HTTP API for a replica (api.Backend): liveness,
// readiness, status and admin requests. It holds only what answering
// needs, so the API reads the replica without reaching into Main's wiring.
type backend struct {
	id        string
	clock     clockwork.Clock
	ctx       context.Context // the replica's run: status refreshes outlive a request, not the replica
	etcd      *clientv3.Client
	prefix    string
	endpoints string // for messages that say which etcd did not answer
	store     *store.Store
	leader    *leader.Loop
	sched     *scheduler.Scheduler
	pub       *redisbroker.Publisher // nil on AMQP, which keeps no run history
	ping      func(context.Context) error
	merger    *sources.Merger
	metrics   *scheduler.Metrics
	feed      *outcome.Feed
	outcomes  outcomeFlags
	started   time.Time
	status    statusCache
	clockOff  *clockOffset
}

// statusCache is the last status read from etcd, so GET /status answers
// within statusBudget while etcd is slow or down.
type statusCache struct {
	mu         sync.Mutex
	last       *api.Status // the last status read from etcd
	lastAt     time.Time
	lastErr    error         // of the last read from etcd; nil once one succeeds
	refreshing chan struct{} // closed when the refresh in flight ends
	wg         sync.WaitGroup
}

// Alive implements api.Backend.
func (b *backend) Alive() error {
	if b.leader.Stopped() {
		return errors.New("leadership loop stopped")
	}
	return nil
}

// Ready implements api.Backend: etcd and the broker answer, and the
// leader can publish.
func (b *backend) Ready(ctx context.Context) error {
	if _, err := b.etcd.Get(ctx, keys.Leaders(b.prefix), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		b.metrics.EtcdErrors.Inc()
		return fmt.Errorf("etcd unreachable: %w", err)
	}
	if err := b.ping(ctx); err != nil {
		b.metrics.RedisErrors.Inc()
		return fmt.Errorf("broker unreachable: %w", err)
	}
	if err := b.merger.Err(); err != nil {
		return err
	}
	if b.leader.Token() != 0 {
		if err := b.sched.PublishError(); err != nil {
			return fmt.Errorf("leader cannot publish: %w", err)
		}
		if err := b.sched.PersistError(); err != nil {
			return fmt.Errorf("leader cannot persist state to etcd (still firing): %w", err)
		}
		if err := b.sched.Health(b.clock.Now()); err != nil {
			return err
		}
		if b.pub != nil {
			if err := b.pub.ReplicationError(); err != nil {
				return fmt.Errorf("leader cannot publish: %w", err)
			}
		}
	}
	return nil
}

// Status implements api.Backend, from etcd, so standbys serve it too. It
// answers within a second even when etcd does not, from what it last knew.
func (b *backend) Status(ctx context.Context, q api.StatusQuery) (api.Status, error) {
	var (
		st  api.Status
		err error
	)
	if q.Default() {
		st, err = b.cachedStatus(ctx)
	} else {
		// Another page: read for this request, not cached.
		if st, err = StatusFromEtcd(ctx, b.etcd, b.prefix, b.sched.Config(), b.history(), b.clock.Now(), q); err != nil {
			return st, err
		}
		b.addLocalResults(&st)
	}
	st.ID = b.id
	st.Sources, st.Conflicts = b.merger.Health(), b.merger.Conflicts()
	st.Leader = st.LeaderID == b.id && st.FencingToken != 0 && b.leader.Token() == st.FencingToken
	if b.clockOff != nil {
		cs := b.clockOff.status()
		st.ClockOffsetSeconds, st.ClockOffsetUncertaintySeconds, st.ClockWarning = cs.OffsetSeconds, cs.UncertaintySeconds, cs.Warning
	}
	if b.feed != nil {
		st.OutcomeWarning = outcomeWarning(b.feed, b.outcomes, b.started, b.clock.Now())
	}
	return st, err
}

// statusBudget is how long GET /status waits for etcd before answering
// from the last status it read, flagged stale.
const statusBudget = 500 * time.Millisecond

// cachedStatus answers from etcd if etcd answers within statusBudget,
// else from the last status read, marked stale with its age. The read
// goes on in the background and refreshes the cache when it ends.
func (b *backend) cachedStatus(ctx context.Context) (api.Status, error) {
	o := &b.status
	o.mu.Lock()
	wait := o.refreshing
	if wait == nil {
		wait = make(chan struct{})
		o.refreshing = wait
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			rctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
			st, err := StatusFromEtcd(rctx, b.etcd, b.prefix, b.sched.Config(), b.history(), b.clock.Now(), api.StatusQuery{Limit: api.DefaultStatusLimit})
			cancel()
			o.mu.Lock()
			o.lastErr = err
			if err == nil {
				o.last, o.lastAt = &st, b.clock.Now()
			} else {
				b.metrics.EtcdErrors.Inc()
			}
			o.refreshing = nil
			o.mu.Unlock()
			close(wait)
		}()
	}
	o.mu.Unlock()
	budget := statusBudget
	t := b.clock.NewTimer(budget)
	defer t.Stop()
	select {
	case <-wait:
	case <-t.Chan():
	case <-ctx.Done():
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var st api.Status
	if o.last != nil {
		st = *o.last
		st.Entries = append([]api.EntryStatus(nil), st.Entries...)
	} else {
		// Nothing read yet: what the config says, with no state.
		st = statusFromConfig(b.sched.Config(), b.clock.Now())
	}
	switch {
	case !isClosed(wait):
		st.Error = fmt.Sprintf("etcd at %s did not answer within %s; this is what the replica last knew", b.endpoints, budget)
	case o.lastErr != nil:
		st.Error = fmt.Sprintf("etcd at %s: %v; this is what the replica last knew", b.endpoints, o.lastErr)
	}
	if st.Error != "" {
		st.Stale = true
		if o.last != nil {
			st.StaleSeconds = roundSeconds(b.clock.Since(o.lastAt))
		}
	}
	b.addLocalResults(&st)
	return st, nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func roundSeconds(d time.Duration) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(d.Seconds(), 'f', 1, 64), 64)
	return v
}

// addLocalResults adds each entry's last result and error, as this
// replica's loop remembers them (only a leader, or a replica that led,
// has any).
func (b *backend) addLocalResults(st *api.Status) {
	results := b.metrics.Results()
	for i := range st.Entries {
		e := &st.Entries[i]
		r, ok := results[e.Name]
		if !ok {
			continue
		}
		e.LastResult, e.LastError = r.LastResult, r.LastError
		e.Health, e.HealthReason = r.Health, r.HealthReason
		e.LastErrorAt, e.LastPublishedAt = timePtr(r.LastErrorAt), timePtr(r.LastSuccessAt)
		if !r.NextFireAt.IsZero() && e.NextRunAt != nil {
			e.NextRunAt = timePtr(r.NextFireAt)
		}
	}
}

// buildStatus reads leadership and entry state from etcd, and the run
// history from the broker (hist may be nil), and merges them with a
// config (which may be nil: then only stored entries show). A broker that
// does not answer leaves the history out, not the status.
func buildStatus(ctx context.Context, cli *clientv3.Client, prefix string, cfg *config.Config, hist outcome.History, now time.Time, q api.StatusQuery) (api.Status, error) {
	var out api.Status
	leader, err := election.Observe(ctx, cli, prefix)
	if err != nil && !errors.Is(err, election.ErrNoLeader) {
		return out, err
	}
	out.LeaderID, out.FencingToken = leader.ID, leader.Token
	sto := store.New(cli, prefix)
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
		table, err := sto.Load(ctx)
		if err != nil {
			return out, err
		}
		states = table.States()
	} else {
		names := make([]string, len(page))
		for i, e := range page {
			names[i] = e.Name
		}
		if states, err = sto.StatesOf(ctx, names); err != nil {
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
	seen := map[string]bool{}
	add := func(name string, e *config.Entry) {
		es := api.EntryStatus{Name: name}
		if e != nil {
			es = api.EntryStatusOf(e)
		}
		es.RecentRuns = []outcome.Run{}
		st := states[name]
		if st != nil {
			es.Paused, es.LastSlot = st.Paused, timePtr(st.LastSlot)
			addOutcomes(&es.Outcomes, name, st.Out, keys.Cluster(prefix))
		}
		if e != nil && e.HoldsOverlap() {
			es.Overlap = string(e.Overlap)
		}
		if h, ok := runs[name]; ok {
			es.TotalRunCount, es.LastRunAt = h.Count, timePtr(h.LastRunAt())
			es.RecentRuns = append(es.RecentRuns, h.Runs...)
		}
		if e != nil {
			es.NextRunAt = timePtr(scheduler.NextFire(e, st, now))
			var left int
			es.Finished, left = scheduler.Finished(e, st, now)
			if left >= 0 {
				es.RemainingRuns = &left
			}
		}
		out.Entries = append(out.Entries, es)
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

// addOutcomes fills es with what the workers reported about the runs of
// entry name.
func addOutcomes(es *api.Outcomes, name string, o *store.Outcomes, cluster string) {
	if o == nil {
		return
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
		ro := api.RunOutcome{Slot: r.Slot, TaskID: id, Manual: r.Manual, Outcome: r.Kind.String(), PublishedAt: r.PublishedAt,
			StartedAt: timePtr(r.Started), UpdatedAt: timePtr(r.Updated), RuntimeSeconds: r.Runtime.Seconds(), Worker: r.Worker,
			Exception: r.ExcType, Message: r.ExcMsg}
		if r.Kind == outcome.Skipped {
			ro.TaskID, ro.SkippedSlots = "", max(r.Skips, 1)
		}
		es.Runs = append(es.Runs, ro)
	}
}

// history is the run history for status, or nil with a broker that keeps
// none (RabbitMQ).
func (b *backend) history() outcome.History {
	if b.pub == nil {
		return nil
	}
	return b.pub
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
