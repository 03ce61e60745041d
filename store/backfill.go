package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Backfill states. Queued and running are unfinished: a new leader
// resumes them. The others are final.
const (
	BackfillQueued      = "queued"
	BackfillRunning     = "running"
	BackfillDone        = "done"
	BackfillCancelled   = "cancelled"
	BackfillInterrupted = "interrupted" // could not go on (the entry left the config)
)

// KeptBackfills is how many finished backfills are kept: for status, and
// so a backfill over a range one of them covered publishes nothing new.
const KeptBackfills = 100

// Backfill is a job that publishes an entry's slots in [From, To], in
// order, at Rate slots a second. The leader running it writes its
// progress (Cursor: the last slot done) at least once a second; the
// broker remembers the same cursor with each publish, so a new leader
// resumes after it without repeating or losing a slot.
type Backfill struct {
	ID           string    `json:"id"`
	Entry        string    `json:"entry"`
	From         time.Time `json:"from"`
	To           time.Time `json:"to"`
	Rate         float64   `json:"rate"` // slots a second
	IncludeFired bool      `json:"include_fired,omitempty"`
	State        string    `json:"state"`
	// Total is the slots in the range; Published those published,
	// Skipped those the run history showed as already fired.
	Total     int       `json:"total"`
	Published int       `json:"published"`
	Skipped   int       `json:"skipped"`
	Cursor    time.Time `json:"cursor,omitzero"` // the last slot published or skipped
	Error     string    `json:"error,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	Note      string    `json:"note,omitempty"`
	Created   time.Time `json:"created"`
	Started   time.Time `json:"started,omitzero"`
	Finished  time.Time `json:"finished,omitzero"`
	Token     int64     `json:"token,omitempty"` // the term that last ran it
}

// Unfinished reports whether the job is still to run.
func (b *Backfill) Unfinished() bool { return b.State == BackfillQueued || b.State == BackfillRunning }

// Covers reports whether the job published or skipped slot: it is in its
// range, up to where it got.
func (b *Backfill) Covers(slot time.Time) bool {
	return !slot.Before(b.From) && !b.Cursor.IsZero() && !slot.After(b.Cursor)
}

func (s *Store) backfillKey(id string) string { return keys.Backfills(s.prefix) + id }

// NewBackfillID returns an id that sorts by creation time.
func NewBackfillID(now time.Time) string {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return "bf-" + now.UTC().Format("20060102T150405") + "-" + hex.EncodeToString(rnd[:])
}

// ErrBackfillBusy is CreateBackfill's answer when the entry has an
// unfinished backfill.
var ErrBackfillBusy = errors.New("store: the entry has an unfinished backfill")

// CreateBackfill stores a queued job, the request that tells the leader
// to run it, and its audit record, in one transaction. It refuses a
// second unfinished job for the same entry (ErrBackfillBusy), since two
// would race over the same slots.
func (s *Store) CreateBackfill(ctx context.Context, b *Backfill, audit *AuditRecord, now time.Time) error {
	jobs, rev, err := s.backfills(ctx)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if j.Entry == b.Entry && j.Unfinished() {
			return fmt.Errorf("%w: %s is %s (cancel it or wait for it)", ErrBackfillBusy, j.ID, j.State)
		}
	}
	if b.ID == "" {
		b.ID = NewBackfillID(now)
	}
	b.State, b.Created = BackfillQueued, now.UTC()
	enc, _ := json.Marshal(b)
	r := Request{ID: b.ID, Op: OpBackfill, Entry: b.Entry, Actor: b.Actor, Note: b.Note, Backfill: b.ID}
	ops := []clientv3.Op{clientv3.OpPut(s.backfillKey(b.ID), string(enc)), s.requestOp(&r, now)}
	if audit != nil {
		audit.At, audit.Request = now, b.ID
		ops = append(ops, s.auditOp(audit))
	}
	// Nothing changed under the prefix since the check: no other job
	// for the entry slipped in.
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(keys.Backfills(s.prefix)).WithPrefix(), "<", rev+1)).
		Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("store: queue backfill of %q: %w", b.Entry, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: another backfill was queued meanwhile; list them and retry", ErrBackfillBusy)
	}
	if audit != nil {
		_ = s.TrimAudit(ctx)
	}
	return nil
}

// Backfills lists the jobs, oldest first.
func (s *Store) Backfills(ctx context.Context) ([]Backfill, error) {
	jobs, _, err := s.backfills(ctx)
	return jobs, err
}

func (s *Store) backfills(ctx context.Context) ([]Backfill, int64, error) {
	resp, err := s.cli.Get(ctx, keys.Backfills(s.prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, fmt.Errorf("store: list backfills: %w", err)
	}
	out := make([]Backfill, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var b Backfill
		if json.Unmarshal(kv.Value, &b) == nil {
			out = append(out, b)
		}
	}
	return out, resp.Header.Revision, nil
}

// Backfill reads one job; ok is false if there is none.
func (s *Store) Backfill(ctx context.Context, id string) (b Backfill, ok bool, err error) {
	resp, err := s.cli.Get(ctx, s.backfillKey(id))
	if err != nil {
		return b, false, fmt.Errorf("store: read backfill %s: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return b, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &b); err != nil {
		return b, false, fmt.Errorf("store: backfill %s: %w", id, err)
	}
	return b, true, nil
}

// SaveBackfill writes a job's progress, guarded by leadership, and
// deletes the keys in also (the request, once the job is final) in the
// same transaction. ErrNotLeader if leadership was lost.
func (s *Store) SaveBackfill(ctx context.Context, g election.Fence, b *Backfill, also ...string) error {
	enc, _ := json.Marshal(b)
	ops := []clientv3.Op{clientv3.OpPut(s.backfillKey(b.ID), string(enc))}
	for _, k := range also {
		if k != "" {
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	return s.commit(ctx, g, ops)
}

// TrimBackfills deletes the oldest finished jobs past KeptBackfills,
// guarded by leadership.
func (s *Store) TrimBackfills(ctx context.Context, g election.Fence) error {
	jobs, err := s.Backfills(ctx)
	if err != nil {
		return err
	}
	var ops []clientv3.Op
	finished := 0
	for _, j := range jobs {
		if !j.Unfinished() {
			finished++
		}
	}
	for _, j := range jobs {
		if finished <= KeptBackfills || len(ops) == s.maxOps {
			break
		}
		if !j.Unfinished() {
			ops = append(ops, clientv3.OpDelete(s.backfillKey(j.ID)))
			finished--
		}
	}
	return s.commit(ctx, g, ops)
}
