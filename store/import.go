package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ImportedState is what another scheduler (celery beat) last sent for an
// entry: the nominal slot beatd continues after.
type ImportedState struct {
	Name     string
	LastSlot time.Time
}

// Import writes each entry's last slot so the first leader catches up from
// it by the entry's policy instead of starting fresh. It refuses entries
// that beatd has already fired (their state has a publish),
// returning their names, unless force. It is meant for a cutover, before
// any beatd leads: writes are not fenced, but each is a transaction on the
// key's revision, so a concurrent write is never lost silently (the entry
// is refused).
func (s *Store) Import(ctx context.Context, states []ImportedState, force bool) (refused []string, err error) {
	for _, in := range states {
		key := s.entryKey(in.Name)
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
		}
		st := &EntryState{Name: in.Name}
		var rev int64
		if len(resp.Kvs) > 0 {
			rev = resp.Kvs[0].ModRevision
			old, err := decode(resp.Kvs[0].Value)
			if err != nil {
				return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
			}
			// A previous import leaves LastRunAt zero: importing again
			// is fine until beatd has published the entry.
			if (!old.LastRunAt.IsZero() || old.TotalRunCount > 0) && !force {
				refused = append(refused, in.Name)
				continue
			}
			st.Paused = old.Paused
		}
		// Since is left zero: the baseline of an earlier start must not
		// hide the slots after the imported one.
		st.Version = formatVersion
		st.LastSlot = in.LastSlot.UTC()
		b, err := json.Marshal(st)
		if err != nil {
			return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
		}
		txn, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return refused, fmt.Errorf("store: import %q: %w", in.Name, err)
		}
		if !txn.Succeeded {
			refused = append(refused, in.Name) // written meanwhile: look again
		}
	}
	return refused, nil
}
