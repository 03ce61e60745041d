package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/status"
)

// liveBudget bounds how long /status waits for the other shard leaders'
// live fields; a leader that has not answered by then is named in its
// shards' live_error, and the rest of the answer stands.
const liveBudget = 700 * time.Millisecond

// liveOf is a loop's record of an entry's last publish, as status shows it.
func liveOf(r scheduler.EntryResult) status.Live {
	return status.Live{Result: r.LastResult, Error: r.LastError, ErrorAt: r.LastErrorAt, PublishedAt: r.LastSuccessAt,
		NextFireAt: r.NextFireAt, Health: r.Health, HealthReason: r.HealthReason}
}

// Live implements api.LiveBackend: the live records of the entries in q's
// range of the asked shards this replica leads in the asked term, from
// their loops, the first q.Limit by name.
func (s *shardSet) Live(q status.LiveQuery) status.LiveAnswer {
	a := status.LiveAnswer{Shards: []int{}, Entries: []status.LiveEntry{}}
	for i, term := range q.Shards {
		if i >= len(s.shards) {
			continue
		}
		sh := s.shards[i]
		sh.mu.Lock()
		held := sh.handover != nil && sh.token == term
		sh.mu.Unlock()
		if !held {
			continue
		}
		a.Shards = append(a.Shards, i)
		for name, r := range sh.metrics.Results() {
			if q.In(name) {
				a.Entries = append(a.Entries, status.LiveEntry{Name: name, Live: liveOf(r)})
			}
		}
	}
	sort.Ints(a.Shards)
	slices.SortFunc(a.Entries, func(x, y status.LiveEntry) int { return strings.Compare(x.Name, y.Name) })
	if len(a.Entries) > q.Limit {
		a.Entries, a.Truncated = a.Entries[:q.Limit], true
	}
	return a
}

// ownLive is the live records of the entries of the shards this replica
// leads.
func (s *shardSet) ownLive() map[string]status.Live {
	out := map[string]status.Live{}
	for _, sh := range s.leadingShards() {
		for name, r := range sh.metrics.Results() {
			out[name] = liveOf(r)
		}
	}
	return out
}

// overlayShardsLive overlays, on a sharded replica's view st of the
// page q, each entry's live fields as its shard's leader knows them: its
// own loops' for the shards it leads, each other leader's from that
// leader (GET /status/live, one request per leader, all at once, within
// liveBudget, as the caller of /status). The range asked of a leader is
// the page's, so the answer holds the page's entries of its shards and
// no others. A shard of the page whose fields are missing says why in
// its live_error: no leader, a leader that did not answer in time, or
// one that no longer holds the term the election showed.
func (b *backend) overlayShardsLive(ctx context.Context, st *api.Status, q api.StatusQuery) {
	n := len(st.Shards)
	if n == 0 {
		// Nothing read from etcd yet (the config's view): who leads the
		// other shards is unknown, this replica's own loops are not.
		st.Overlay(b.shards.ownLive())
		return
	}
	byLeader := map[string]*status.LiveQuery{}
	for _, e := range st.Entries {
		i := keys.ShardOf(e.Name, n)
		sh := &st.Shards[i]
		if sh.LeaderID == "" || sh.FencingToken == 0 {
			sh.LiveError = "no leader"
			continue
		}
		lq := byLeader[sh.LeaderID]
		if lq == nil {
			lq = &status.LiveQuery{Shards: map[int]int64{}, After: q.After, Prefix: q.Prefix, Limit: min(q.Limit, status.MaxLiveLimit)}
			byLeader[sh.LeaderID] = lq
		}
		lq.Shards[i] = sh.FencingToken
		lq.Through = max(lq.Through, e.Name)
	}
	if len(byLeader) == 0 {
		return
	}
	var replicas []election.Replica
	var replicasErr error
	ctx, cancel := context.WithTimeout(ctx, liveBudget)
	defer cancel()
	for id := range byLeader {
		if id == b.id {
			continue
		}
		if st.Stale {
			// The leaders' addresses are in etcd, which did not answer:
			// waiting for it again would break /status's second.
			replicasErr = errors.New("etcd did not answer, and the replicas' addresses are there")
		} else {
			replicas, replicasErr = election.Replicas(ctx, b.etcd, b.prefix)
		}
		break
	}
	answers := make(map[string]status.LiveAnswer, len(byLeader))
	errs := make(map[string]error, len(byLeader))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, lq := range byLeader {
		wg.Go(func() {
			var a status.LiveAnswer
			var err error
			switch {
			case id == b.id:
				a = b.shards.Live(*lq)
			case replicasErr != nil:
				err = fmt.Errorf("leader %s: the registry of replicas: %w", id, replicasErr)
			default:
				a, err = b.askLive(ctx, id, replicas, *lq)
			}
			mu.Lock()
			defer mu.Unlock()
			answers[id], errs[id] = a, err
		})
	}
	wg.Wait()
	live := map[string]status.Live{}
	for id, lq := range byLeader {
		a := answers[id]
		for _, e := range a.Entries {
			live[e.Name] = e.Live
		}
		for i, term := range lq.Shards {
			switch {
			case errs[id] != nil:
				st.Shards[i].LiveError = errs[id].Error()
			case !slices.Contains(a.Shards, i):
				st.Shards[i].LiveError = fmt.Sprintf("%s no longer leads it in the term the election shows (%d)", id, term)
			case a.Truncated:
				st.Shards[i].LiveError = fmt.Sprintf("%s gave the first %d of its entries' live fields in the page", id, lq.Limit)
			}
		}
	}
	st.Overlay(live)
}

// askLive asks replica id, at the address it registered, for the live
// records lq selects.
func (b *backend) askLive(ctx context.Context, id string, replicas []election.Replica, lq status.LiveQuery) (status.LiveAnswer, error) {
	var a status.LiveAnswer
	addr, err := election.LeaderURL(election.Leader{ID: id}, replicas)
	if err != nil {
		return a, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr+"/status/live?"+lq.Values().Encode(), nil)
	if err != nil {
		return a, fmt.Errorf("leader %s at %s: %w", id, addr, err)
	}
	auth.Forward(ctx, req) // the leader guards its reads as this replica does
	resp, err := b.peers.Do(req)
	if err != nil {
		return a, fmt.Errorf("leader %s at %s does not answer: %w", id, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return a, fmt.Errorf("leader %s at %s answered %s", id, addr, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return a, fmt.Errorf("leader %s at %s: %w", id, addr, err)
	}
	return a, nil
}
