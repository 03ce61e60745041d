package daemon

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/jonboulle/clockwork"
)

// TestShardBalanceUnstalls pins the rules that keep the stall
// testkit/shardsim once had (8 shards held 1/4/3 by 3 replicas, never
// balanced) out of beatd: the replica below lo campaigns for the shards
// of every replica above lo, the replica at hi campaigns for none (so it cannot take a
// handed-over shard back), and the replica above lo hands one of its
// shards over as soon as a candidate waits for it. A pure unit over the
// view balance reads: the shards' elections are beside the point.
func TestShardBalanceUnstalls(t *testing.T) {
	// leaders of shards 0-7: x leads 4, y 3, z 1.
	leaders := []string{"x", "x", "x", "x", "y", "y", "y", "z"}
	view := func(waiting []int) *shardView {
		v := &shardView{leaders: leaders, waiting: waiting, held: map[string]int{}}
		for _, id := range leaders {
			v.held[id]++
		}
		return v
	}
	// set is replica id's shardSet at that view, 3 replicas live; a shard
	// it leads has a handover that appends to handed.
	set := func(id string, v *shardView, handed *[]int) *shardSet {
		s := &shardSet{id: id, n: len(leaders), clock: clockwork.NewFakeClock(), log: slog.New(slog.DiscardHandler)}
		s.live.Store(3)
		ids := []string{"x", "y", "z"}
		s.ids.Store(&ids)
		s.view.Store(v)
		for i, l := range leaders {
			sh := &shard{i: i}
			if l == id {
				sh.handover = func() { *handed = append(*handed, i) }
			}
			s.shards = append(s.shards, sh)
		}
		return s
	}
	for _, tc := range []struct {
		id    string
		wants []int // shards it campaigns for
	}{
		{"z", []int{0, 1, 2, 3, 4, 5, 6}}, // 1 < lo 2: every shard of a replica above lo (what it loads is bounded by prepare)
		{"y", nil},                        // 3 = hi: none
		{"x", nil},                        // 4 > hi: none
	} {
		s := set(tc.id, view(make([]int, len(leaders))), new([]int))
		var got []int
		for _, sh := range s.shards {
			if sh.handover == nil && s.wants(sh) {
				got = append(got, sh.i)
			}
		}
		if lo, hi := s.share(); lo != 2 || hi != 3 || !slices.Equal(got, tc.wants) {
			t.Errorf("%s (share %d-%d) campaigns for %v, want %v", tc.id, lo, hi, got, tc.wants)
		}
	}
	// z queues for x's shards: x, above lo, hands over one a candidate
	// waits for, once per balance period; with nobody waiting it keeps
	// them all (a shard handed to nobody would go unled).
	for _, tc := range []struct {
		name    string
		waiting []int
		handed  int
	}{
		{"z waits for x's shards", []int{1, 1, 1, 1, 0, 0, 0, 0}, 1},
		{"z waits for shard 3 only", []int{0, 0, 0, 1, 0, 0, 0, 0}, 1},
		{"nobody waits", make([]int, len(leaders)), 0},
	} {
		var handed []int
		s := set("x", view(tc.waiting), &handed)
		if lo, _ := s.share(); s.held() > lo {
			s.handOverOne()
		}
		if len(handed) != tc.handed || (tc.handed == 1 && tc.waiting[handed[0]] == 0) {
			t.Errorf("%s: x handed over %v, want %d shard(s) with a candidate waiting", tc.name, handed, tc.handed)
		}
	}
}
