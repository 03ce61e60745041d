package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotLeader means a guarded write was refused: the leader key is gone
// or belongs to a newer term. Nothing was changed.
var ErrNotLeader = errors.New("store: not leader")

// Format version of stored values. Readers accept older versions and
// migrate them; a newer version is an error, not a guess.
const formatVersion = 1

// RecentRuns is how many runs each entry remembers.
const RecentRuns = 20

// MaxOpsPerTxn is etcd's default --max-txn-ops.
const MaxOpsPerTxn = 128

// DefaultRemovedGrace is how long the state of an entry removed from the
// config is kept, so a config rolled back within it resumes where it was.
const DefaultRemovedGrace = 7 * 24 * time.Hour

// Run is one publish of an entry.
type Run struct {
	Slot        time.Time `json:"slot"`
	PublishedAt time.Time `json:"published_at"`
	Token       int64     `json:"token"`
	TaskID      string    `json:"task_id"`
	Manual      bool      `json:"manual,omitempty"`
}

// EntryState is what beatd remembers about one entry.
type EntryState struct {
	Version       int       `json:"v"`
	Name          string    `json:"name"`
	LastSlot      time.Time `json:"last_slot"`   // nominal time of the last slot fired
	LastRunAt     time.Time `json:"last_run_at"` // when it was published
	TotalRunCount int64     `json:"total_run_count"`
	Paused        bool      `json:"paused"`
	Recent        []Run     `json:"recent_runs"`
	RemovedAt     time.Time `json:"removed_at,omitzero"` // set when the entry left the config
	// Since is when the entry's current schedule began to be owed: set
	// when a leader first schedules it, when its config changes, and on
	// resume. A later leader catches up from max(LastSlot, Since), so a
	// slot due before anyone fired the entry is still owed after a
	// failover, and slots from before a change or a pause are not.
	Since time.Time `json:"since,omitzero"`
}

// CatchupFrom is the instant after which missed slots are owed.
func (s *EntryState) CatchupFrom() time.Time {
	if s.Since.After(s.LastSlot) {
		return s.Since
	}
	return s.LastSlot
}

// Record appends a run, keeping the newest RecentRuns, and advances the
// counters. A manual run does not move LastSlot.
func (s *EntryState) Record(r Run) {
	if !r.Manual && r.Slot.After(s.LastSlot) {
		s.LastSlot = r.Slot
	}
	if r.PublishedAt.After(s.LastRunAt) {
		s.LastRunAt = r.PublishedAt
	}
	s.TotalRunCount++
	s.Recent = append(s.Recent, r)
	if n := len(s.Recent); n > RecentRuns {
		s.Recent = append(s.Recent[:0:0], s.Recent[n-RecentRuns:]...)
	}
}

// Guard is the leadership a write must hold.
type Guard struct {
	Key   string
	Token int64
}

func (g Guard) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(g.Key), "=", g.Token)
}

// Store reads and writes entry state under a prefix.
type Store struct {
	cli    *clientv3.Client
	prefix string
}

// New returns a Store for the cluster under prefix, e.g. "/beatd/default/".
func New(cli *clientv3.Client, prefix string) *Store {
	return &Store{cli: cli, prefix: prefix}
}

func (s *Store) entryKey(name string) string { return s.prefix + "entries/" + name }

// Load reads every entry's state, keyed by name.
func (s *Store) Load(ctx context.Context) (map[string]*EntryState, error) {
	resp, err := s.cli.Get(ctx, s.prefix+"entries/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("store: load: %w", err)
	}
	out := make(map[string]*EntryState, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		st, err := decode(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("store: load %q: %w", kv.Key, err)
		}
		st.Name = strings.TrimPrefix(string(kv.Key), s.prefix+"entries/")
		out[st.Name] = st
	}
	return out, nil
}

// Get reads one entry's state; a missing entry has zero state.
func (s *Store) Get(ctx context.Context, name string) (*EntryState, error) {
	resp, err := s.cli.Get(ctx, s.entryKey(name))
	if err != nil {
		return nil, fmt.Errorf("store: get %q: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return &EntryState{Version: formatVersion, Name: name}, nil
	}
	st, err := decode(resp.Kvs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("store: get %q: %w", name, err)
	}
	st.Name = name
	return st, nil
}

func decode(b []byte) (*EntryState, error) {
	var st EntryState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	if st.Version > formatVersion {
		return nil, fmt.Errorf("state format v%d is newer than this beatd (v%d): upgrade beatd", st.Version, formatVersion)
	}
	st.Version = formatVersion // v1 is the first format: nothing to migrate yet
	return &st, nil
}

// Save writes states in as few transactions as etcd allows, each guarded by
// g. If leadership was lost, it returns ErrNotLeader and that transaction
// changed nothing (earlier transactions of the batch stay committed: each
// holds whole entries, so state is never torn).
func (s *Store) Save(ctx context.Context, g Guard, states []*EntryState) error {
	ops := make([]clientv3.Op, 0, min(len(states), MaxOpsPerTxn))
	for _, st := range states {
		st.Version = formatVersion
		b, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("store: encode %q: %w", st.Name, err)
		}
		ops = append(ops, clientv3.OpPut(s.entryKey(st.Name), string(b)))
		if len(ops) == MaxOpsPerTxn {
			if err := s.commit(ctx, g, ops); err != nil {
				return err
			}
			ops = ops[:0]
		}
	}
	return s.commit(ctx, g, ops)
}

// Delete removes entries' state, guarded by g.
func (s *Store) Delete(ctx context.Context, g Guard, names []string) error {
	ops := make([]clientv3.Op, 0, min(len(names), MaxOpsPerTxn))
	for _, n := range names {
		ops = append(ops, clientv3.OpDelete(s.entryKey(n)))
		if len(ops) == MaxOpsPerTxn {
			if err := s.commit(ctx, g, ops); err != nil {
				return err
			}
			ops = ops[:0]
		}
	}
	return s.commit(ctx, g, ops)
}

func (s *Store) commit(ctx context.Context, g Guard, ops []clientv3.Op) error {
	if len(ops) == 0 {
		return nil
	}
	resp, err := s.cli.Txn(ctx).If(g.cmp()).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("store: commit %d ops: %w", len(ops), err)
	}
	if !resp.Succeeded {
		return ErrNotLeader
	}
	return nil
}

// Prune handles state of entries no longer configured: the first time it
// is seen, it is marked removed; after grace it is deleted. It returns the
// states it marked, for the caller's view.
func (s *Store) Prune(ctx context.Context, g Guard, states map[string]*EntryState, configured map[string]bool, now time.Time, grace time.Duration) error {
	var mark []*EntryState
	var del []string
	for name, st := range states {
		switch {
		case configured[name]:
			if !st.RemovedAt.IsZero() { // back in the config
				st.RemovedAt = time.Time{}
				mark = append(mark, st)
			}
		case st.RemovedAt.IsZero():
			st.RemovedAt = now
			mark = append(mark, st)
		case now.Sub(st.RemovedAt) > grace:
			del = append(del, name)
		}
	}
	if err := s.Save(ctx, g, mark); err != nil {
		return err
	}
	if err := s.Delete(ctx, g, del); err != nil {
		return err
	}
	for _, n := range del {
		delete(states, n)
	}
	return nil
}
