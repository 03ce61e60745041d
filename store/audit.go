package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/beatd/beatd/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultAuditKeep is how many audit records a cluster keeps: the oldest
// go once there are more. At a few hundred bytes each, 10,000 records are
// a few MB of etcd, and years of a team's pauses and triggers.
const DefaultAuditKeep = 10000

// AuditRecord is one change made through the CLI, the API or the console:
// who (the token's name), when, what, to which entry, and why.
type AuditRecord struct {
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`          // the token's name; "etcd" for the CLI writing to etcd directly
	Role   string    `json:"role,omitempty"` // the token's role
	Via    string    `json:"via"`            // api, cli, console, or etcd (the CLI without --server)
	Action string    `json:"action"`         // pause, resume, trigger, backfill, backfill-cancel, put, delete
	Entry  string    `json:"entry,omitempty"`
	// Entries are the entries of a change to many at once (one
	// transaction of `entries apply`); Entry is then empty.
	Entries []string `json:"entries,omitempty"`
	Note    string   `json:"note,omitempty"`
	Detail  string   `json:"detail,omitempty"`  // e.g. a backfill's range
	Request string   `json:"request,omitempty"` // the admin request or backfill it queued
	Key     string   `json:"-"`
}

// Concerns reports whether the record is about entry.
func (r *AuditRecord) Concerns(entry string) bool {
	return r.Entry == entry || slices.Contains(r.Entries, entry)
}

func (s *Store) auditPrefix() string { return keys.Audit(s.prefix) }

// auditOp is the put of rec under a key that sorts by time.
func (s *Store) auditOp(rec *AuditRecord) clientv3.Op {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	rec.At = rec.At.UTC()
	rec.Key = s.auditPrefix() + rec.At.Format("20060102T150405.000000000Z") + "-" + hex.EncodeToString(rnd[:])
	b, _ := json.Marshal(rec)
	return clientv3.OpPut(rec.Key, string(b))
}

// Audit stores rec. It needs no leadership: the replica that took the
// change records it.
func (s *Store) Audit(ctx context.Context, rec AuditRecord) error {
	if _, err := s.cli.Do(ctx, s.auditOp(&rec)); err != nil {
		return fmt.Errorf("store: audit %s: %w", rec.Action, err)
	}
	return s.TrimAudit(ctx)
}

// AuditKeep is how many records TrimAudit keeps (DefaultAuditKeep when 0).
func (s *Store) AuditKeep() int {
	if s.auditKeep > 0 {
		return s.auditKeep
	}
	return DefaultAuditKeep
}

// SetAuditKeep sets how many audit records are kept.
func (s *Store) SetAuditKeep(n int) { s.auditKeep = n }

// auditSlack is how far past the bound the records may grow before a
// trim: trimming every record would cost a range delete per change.
const auditSlack = 64

// TrimAudit deletes the oldest records past AuditKeep.
func (s *Store) TrimAudit(ctx context.Context) error {
	keep := s.AuditKeep()
	p := s.auditPrefix()
	n, err := s.cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("store: count audit records: %w", err)
	}
	over := int(n.Count) - keep
	if over <= 0 || over < auditSlack && int(n.Count) < 2*keep {
		return nil
	}
	old, err := s.cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(over)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil || len(old.Kvs) == 0 {
		return err
	}
	last := string(old.Kvs[len(old.Kvs)-1].Key)
	if _, err := s.cli.Delete(ctx, p, clientv3.WithRange(last+"\x00")); err != nil {
		return fmt.Errorf("store: trim audit records: %w", err)
	}
	return nil
}

// AuditLog returns the newest records first, at most limit (0: all), of
// entry ("" for every entry).
func (s *Store) AuditLog(ctx context.Context, entry string, limit int) ([]AuditRecord, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)}
	if entry == "" && limit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	resp, err := s.cli.Get(ctx, s.auditPrefix(), opts...)
	if err != nil {
		return nil, fmt.Errorf("store: read audit records: %w", err)
	}
	var out []AuditRecord
	for _, kv := range resp.Kvs {
		var r AuditRecord
		if json.Unmarshal(kv.Value, &r) != nil {
			continue
		}
		if entry != "" && !r.Concerns(entry) {
			continue
		}
		r.Key = string(kv.Key)
		out = append(out, r)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out, nil
}
