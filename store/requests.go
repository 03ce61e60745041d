package store

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/beatd/beatd/internal/keys"
	"time"

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
)

// Request asks the leader to act on an entry.
type Request struct {
	ID          string    `json:"id"`
	Op          Op        `json:"op"`
	Entry       string    `json:"entry"`
	RequestedAt time.Time `json:"requested_at"`
	// RespectOverlap makes a trigger obey the entry's overlap policy;
	// by default a manual trigger publishes even while a run is unfinished.
	RespectOverlap bool   `json:"respect_overlap,omitempty"`
	Key            string `json:"-"`
}

func (s *Store) requestPrefix() string { return keys.Requests(s.prefix) }

// PutRequest queues a request for the leader. It needs no leadership.
// respectOverlap (triggers only) makes the trigger obey the entry's
// overlap policy.
func (s *Store) PutRequest(ctx context.Context, op Op, entry string, now time.Time, respectOverlap bool) (Request, error) {
	r := Request{ID: uuid.NewString(), Op: op, Entry: entry, RequestedAt: now.UTC(), RespectOverlap: respectOverlap && op == OpTrigger}
	b, _ := json.Marshal(r)
	r.Key = s.requestPrefix() + r.RequestedAt.Format("20060102T150405.000000000Z") + "-" + r.ID
	if _, err := s.cli.Put(ctx, r.Key, string(b)); err != nil {
		return r, fmt.Errorf("store: queue %s %q: %w", op, entry, err)
	}
	return r, nil
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
