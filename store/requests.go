package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/beatd/beatd/internal/keys"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Op is an admin request.
type Op string

// Admin operations. The CLI writes them under the prefix from anywhere;
// the leader applies them, fenced, and deletes them.
const (
	OpTrigger Op = "trigger"
	OpPause   Op = "pause"
	OpResume  Op = "resume"
	// OpBackfill starts (or, for a new leader, resumes) the backfill job
	// the request names; the request is completed when the job ends.
	OpBackfill Op = "backfill"
	// OpCancelBackfill stops the backfill job it names.
	OpCancelBackfill Op = "backfill-cancel"
)

// Request asks the leader to act on an entry.
type Request struct {
	ID          string    `json:"id"`
	Op          Op        `json:"op"`
	Entry       string    `json:"entry"`
	RequestedAt time.Time `json:"requested_at"`
	// RespectOverlap makes a trigger obey the entry's overlap policy;
	// by default a manual trigger publishes even while a run is unfinished.
	RespectOverlap bool `json:"respect_overlap,omitempty"`
	// Actor is who asked (a token's name), Note why: a pause keeps both
	// with the entry's state, for status to show.
	Actor string `json:"actor,omitempty"`
	Note  string `json:"note,omitempty"`
	// Backfill is the job a backfill or backfill-cancel request names.
	Backfill string `json:"backfill,omitempty"`
	Key      string `json:"-"`
}

func (s *Store) requestPrefix() string { return keys.Requests(s.prefix) }

// PutRequest queues r for the leader, with its audit record (nil for
// none) in the same transaction, so no change goes unrecorded. It needs
// no leadership. It sets r's ID (unless set), its time and its key.
func (s *Store) PutRequest(ctx context.Context, r Request, audit *AuditRecord, now time.Time) (Request, error) {
	ops := []clientv3.Op{s.requestOp(&r, now)}
	if audit != nil {
		audit.At, audit.Request = now, r.ID
		ops = append(ops, s.auditOp(audit))
	}
	if _, err := s.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return r, fmt.Errorf("store: queue %s %q: %w", r.Op, r.Entry, err)
	}
	if audit != nil {
		_ = s.TrimAudit(ctx) // best effort: the next record trims too
	}
	return r, nil
}

func (s *Store) requestOp(r *Request, now time.Time) clientv3.Op {
	if r.ID == "" {
		r.ID = uuid.NewString()
	}
	r.RequestedAt = now.UTC()
	r.RespectOverlap = r.RespectOverlap && r.Op == OpTrigger
	b, _ := json.Marshal(r)
	r.Key = s.requestPrefix() + r.RequestedAt.Format("20060102T150405.000000000Z") + "-" + r.ID
	return clientv3.OpPut(r.Key, string(b))
}

// PendingRequests lists queued requests, oldest first, and the revision to
// watch from for newer ones.
func (s *Store) PendingRequests(ctx context.Context) ([]Request, int64, error) {
	resp, err := s.cli.Get(ctx, s.requestPrefix(), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, fmt.Errorf("store: list requests: %w", err)
	}
	out := make([]Request, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r Request
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			continue // not ours to interpret; CompleteRequest will not see it either
		}
		r.Key = string(kv.Key)
		out = append(out, r)
	}
	return out, resp.Header.Revision, nil
}

// WatchRequests signals on the returned channel whenever a request is
// queued after rev. The channel closes when ctx ends.
func (s *Store) WatchRequests(ctx context.Context, rev int64) <-chan struct{} {
	out := make(chan struct{}, 1)
	wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), s.requestPrefix(), clientv3.WithPrefix(),
		clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	go func() {
		defer close(out)
		for range wch {
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out
}
