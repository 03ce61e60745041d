package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/broker"
	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Alive implements api.Backend.
func (m *Main) Alive() error {
	if m.leader.Stopped() {
		return errors.New("leadership loop stopped")
	}
	return nil
}

// Ready implements api.Backend: etcd and the broker answer, and the
// leader can publish.
func (m *Main) Ready(ctx context.Context) error {
	if _, err := m.etcd.Get(ctx, keys.Leaders(m.Etcd.KeyPrefix()), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		m.metrics.EtcdErrors.Inc()
		return fmt.Errorf("etcd unreachable: %w", err)
	}
	if err := m.brokerPing(ctx); err != nil {
		m.metrics.RedisErrors.Inc()
		return fmt.Errorf("broker unreachable: %w", err)
	}
	if err := m.merger.Err(); err != nil {
		return err
	}
	if m.leader.Token() != 0 {
		if err := m.sched.PublishError(); err != nil {
			return fmt.Errorf("leader cannot publish: %w", err)
		}
		if err := m.sched.PersistError(); err != nil {
			return fmt.Errorf("leader cannot persist state to etcd (still firing): %w", err)
		}
		if m.pub != nil {
			if err := m.pub.ReplicationError(); err != nil {
				return fmt.Errorf("leader cannot publish: %w", err)
			}
		}
	}
	return nil
}

// Status implements api.Backend, from etcd, so standbys serve it too. It
// answers within a second even when etcd does not, from what it last knew.
func (m *Main) Status(ctx context.Context) (api.Status, error) {
	st, err := m.cachedStatus(ctx)
	st.ID = m.ID
	st.Sources, st.Conflicts = m.merger.Health(), m.merger.Conflicts()
	st.Leader = st.LeaderID == m.ID && st.FencingToken != 0 && m.leader.Token() == st.FencingToken
	return st, err
}

// Request implements api.Backend.
func (m *Main) Request(ctx context.Context, op, entry string) (string, error) {
	if m.sched.Config().Entry(entry) == nil {
		return "", api.ErrUnknownEntry
	}
	r, err := m.store.PutRequest(ctx, store.Op(op), entry, time.Now())
	return r.ID, err
}

// HistoryReader reads the run history the publisher keeps with the broker.
type HistoryReader interface {
	Histories(ctx context.Context, names []string) (map[string]redisbroker.History, error)
}

// buildStatus reads leadership and entry state from etcd, and the run
// history from the broker (hist may be nil), and merges them with a
// config (which may be nil: then only stored entries show). A broker that
// does not answer leaves the history out, not the status.
func buildStatus(ctx context.Context, cli *clientv3.Client, prefix string, cfg *config.Config, hist HistoryReader, now time.Time) (api.Status, error) {
	var out api.Status
	leader, err := election.Observe(ctx, cli, prefix)
	if err != nil && !errors.Is(err, election.ErrNoLeader) {
		return out, err
	}
	out.LeaderID, out.FencingToken = leader.ID, leader.Token
	table, err := store.New(cli, prefix).Load(ctx)
	if err != nil {
		return out, err
	}
	states := table.States()
	var names []string
	if cfg != nil {
		for _, e := range cfg.Entries {
			names = append(names, e.Name)
		}
	}
	for name := range states {
		if cfg == nil || cfg.Entry(name) == nil {
			names = append(names, name)
		}
	}
	var runs map[string]redisbroker.History
	if hist != nil {
		if runs, err = hist.Histories(ctx, names); err != nil {
			out.HistoryError = err.Error()
		}
	}
	seen := map[string]bool{}
	add := func(name string, e *config.Entry) {
		es := api.EntryStatus{Name: name, RecentRuns: []broker.Run{}}
		if e != nil {
			es.Task, es.Schedule, es.Enabled, es.Source = e.Task, fmt.Sprint(e.Schedule), e.Enabled, e.Source
		}
		st := states[name]
		if st != nil {
			es.Paused, es.LastSlot = st.Paused, timePtr(st.LastSlot)
		}
		if h, ok := runs[name]; ok {
			es.TotalRunCount, es.LastRunAt = h.Count, timePtr(h.LastRunAt())
			es.RecentRuns = append(es.RecentRuns, h.Runs...)
		}
		if e != nil {
			es.NextRunAt = timePtr(scheduler.NextFire(e, st, now))
		}
		out.Entries = append(out.Entries, es)
		seen[name] = true
	}
	if cfg != nil {
		for _, e := range cfg.Entries {
			add(e.Name, e)
		}
	}
	for name := range states {
		if !seen[name] {
			add(name, nil)
		}
	}
	return out, nil
}

// history is the run history for status, or nil with a broker that keeps
// none (RabbitMQ).
func (m *Main) history() HistoryReader {
	if m.pub == nil {
		return nil
	}
	return m.pub
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
