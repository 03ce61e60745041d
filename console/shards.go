package console

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/status"
)

// LedShard is a shard this replica leads now, on a sharded cluster: its
// term's token and the timeline of that term's fires (each shard's loop
// feeds its own).
type LedShard struct {
	Shard    int
	Term     int64
	Elected  time.Time // when this replica won the term (zero: unknown)
	Timeline *Timeline
}

// shardData is one shard leader's numbers for one of its terms.
type shardData struct {
	Shard int   `json:"shard"`
	Term  int64 `json:"term"`
	leaderData
}

// shardsAnswer is GET /console/leader.json?shard=I:TERM…: the numbers of
// each asked shard whose term the replica holds; a shard it no longer
// leads in that term is left out.
type shardsAnswer struct {
	Shards []shardData `json:"shards"`
}

// localShardData is this replica's numbers for the shards asked (shard
// to term) that it leads in that term.
func (s *Server) localShardData(ctx context.Context, want map[int]int64, names []string) []shardData {
	if s.cfg.LedShards == nil {
		return nil
	}
	var out []shardData
	for _, ls := range s.cfg.LedShards() {
		if t, ok := want[ls.Shard]; !ok || t != ls.Term || ls.Timeline == nil {
			continue
		}
		d := leaderData{Timeline: termSnapshot(ls, names)}
		if s.cluster.ready(ctx) == nil {
			d.Backlog, d.BacklogOK = s.backlog(ls.Timeline, ls.Term)
		}
		out = append(out, shardData{Shard: ls.Shard, Term: ls.Term, leaderData: d})
	}
	return out
}

// termSnapshot is ls's timeline as of its term ls.Term. A shard's
// timeline starts over only at the new term's first fire, so until then
// it still holds an earlier term's fires (a lease lost under load, won
// back or handed around): counted as this term's they would be fires this
// term never made, and the total would drop when its first fire came.
// Until then the term has no fires, counted since it was won.
func termSnapshot(ls LedShard, names []string) Snapshot {
	snap := ls.Timeline.Snapshot(names)
	if snap.Term == ls.Term {
		return snap
	}
	for i := range snap.Minutes {
		snap.Minutes[i] = Minute{Start: snap.Minutes[i].Start}
	}
	snap.Term, snap.Since, snap.Entries = ls.Term, ls.Elected, map[string]EntryFires{}
	return snap
}

// fetchShardsData gathers the numbers of every shard of a sharded
// cluster from the replica that leads it in the term the elections show:
// this replica's own from memory, each other leader's in one request
// (cached as a standby caches the leader's). What a shard's leader does
// not give is named in the error, and the rest is merged (mergeShards);
// only when no shard's numbers came is the result nil.
func (s *Server) fetchShardsData(ctx context.Context, shards []status.ShardStatus, replicas []election.Replica, names []string) (*leaderData, []int, error) {
	byLeader := map[string]map[int]int64{}
	var missing []string
	var unled []int
	for _, sh := range shards {
		if sh.LeaderID == "" || sh.FencingToken == 0 {
			unled = append(unled, sh.Shard)
			continue
		}
		if byLeader[sh.LeaderID] == nil {
			byLeader[sh.LeaderID] = map[int]int64{}
		}
		byLeader[sh.LeaderID][sh.Shard] = sh.FencingToken
	}
	if len(unled) > 0 {
		missing = append(missing, "shard "+ints(unled)+": no leader")
	}
	ids := make([]string, 0, len(byLeader))
	for id := range byLeader {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var parts []shardData
	for _, id := range ids {
		want := byLeader[id]
		var got []shardData
		var err error
		if id == s.cfg.ID {
			got = s.localShardData(ctx, want, names)
		} else {
			got, err = s.askShardsCached(ctx, id, want, replicas, names)
		}
		var lost []int
		for i := range want {
			if !slices.ContainsFunc(got, func(d shardData) bool { return d.Shard == i }) {
				lost = append(lost, i)
			}
		}
		sort.Ints(lost)
		switch {
		case err != nil:
			missing = append(missing, "shard "+ints(lost)+": "+err.Error())
		case len(lost) > 0:
			missing = append(missing, fmt.Sprintf("shard %s: %s no longer leads it in the term the election shows", ints(lost), id))
		}
		parts = append(parts, got...)
	}
	var errOut error
	if len(missing) > 0 {
		errOut = errors.New(strings.Join(missing, "; "))
	}
	if len(parts) == 0 {
		return nil, nil, cmpErr(errOut, errors.New("no shard's leader answered"))
	}
	d, counted := mergeShards(parts)
	return &d, counted, errOut
}

func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// askShardsCached is askShards, shared by every viewer for
// leaderCacheFor.
func (s *Server) askShardsCached(ctx context.Context, id string, want map[int]int64, replicas []election.Replica, names []string) ([]shardData, error) {
	q := shardQuery(want, names)
	return askCached(s, &s.shardCache, id+"\x00"+q.Encode(), func() ([]shardData, error) {
		return s.askShards(ctx, id, q, replicas)
	})
}

func shardQuery(want map[int]int64, names []string) url.Values {
	q := url.Values{"name": names}
	keys := make([]int, 0, len(want))
	for i := range want {
		keys = append(keys, i)
	}
	sort.Ints(keys)
	for _, i := range keys {
		q.Add("shard", fmt.Sprintf("%d:%d", i, want[i]))
	}
	return q
}

// askShards asks replica id's console for its shards' numbers.
func (s *Server) askShards(ctx context.Context, id string, q url.Values, replicas []election.Replica) ([]shardData, error) {
	var a shardsAnswer
	if err := s.leaderJSON(ctx, id, q, replicas, &a); err != nil {
		return nil, err
	}
	return a.Shards, nil
}

// mergeShards adds the shards' numbers up into one: fires and failed
// publishes per minute are summed (minutes matched by their start), an
// entry's fires are its shard's (an entry is in one shard), the persist
// backlog is the sum and known only when every shard's is. A minute's lag
// p99 is the highest of the shards' p99s, an upper bound of the cluster's
// (percentiles do not add). Since is the latest term start, the time from
// which every counted shard's fires are all in the counts. It returns the
// shards counted, in order.
func mergeShards(parts []shardData) (leaderData, []int) {
	sort.Slice(parts, func(i, j int) bool { return parts[i].Shard < parts[j].Shard })
	d := leaderData{BacklogOK: true, Timeline: Snapshot{Entries: map[string]EntryFires{}}}
	d.Timeline.Minutes = append([]Minute(nil), parts[0].Timeline.Minutes...)
	at := make(map[time.Time]int, len(d.Timeline.Minutes))
	for i, m := range d.Timeline.Minutes {
		at[m.Start] = i
		d.Timeline.Minutes[i] = Minute{Start: m.Start}
	}
	counted := make([]int, 0, len(parts))
	for _, p := range parts {
		counted = append(counted, p.Shard)
		for _, m := range p.Timeline.Minutes {
			if i, ok := at[m.Start]; ok {
				dm := &d.Timeline.Minutes[i]
				dm.Fires += m.Fires
				dm.Errors += m.Errors
				dm.LagP99 = max(dm.LagP99, m.LagP99)
			}
		}
		for n, f := range p.Timeline.Entries {
			d.Timeline.Entries[n] = f
		}
		if p.Timeline.Since.After(d.Timeline.Since) {
			d.Timeline.Since = p.Timeline.Since
		}
		d.Backlog += p.Backlog
		d.BacklogOK = d.BacklogOK && p.BacklogOK
	}
	return d, counted
}

// ints is "0, 2, 3".
func ints(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ", ")
}
