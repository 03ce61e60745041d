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
// shards over as soon as a candidate next in line that leads two fewer
// waits for it. A pure unit over the
// view balance reads: the shards' elections are beside the point.
func TestShardBalanceUnstalls(t *testing.T) {
	// leaders of shards 0-7: x leads 4, y 3, z 1.
	leaders := []string{"x", "x", "x", "x", "y", "y", "y", "z"}
	view := func(waiters [][]string) *shardView {
		v := &shardView{leaders: leaders, waiters: waiters, held: map[string]int{}}
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
		s := set(tc.id, view(make([][]string, len(leaders))), new([]int))
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
	// them all (a shard handed to nobody would go unled). A candidate
	// next in line that leads one fewer than x (y, 3 to x's 4) would
	// lead one more after it: x keeps the shard, which would otherwise
	// go back and forth (a 900,000-entry run's 37 s move).
	z, y := []string{"z"}, []string{"y"}
	for _, tc := range []struct {
		name    string
		waiters [][]string
		handed  int
	}{
		{"z waits for x's shards", [][]string{z, z, z, z, nil, nil, nil, nil}, 1},
		{"z waits for shard 3 only", [][]string{nil, nil, nil, z, nil, nil, nil, nil}, 1},
		{"z waits behind y", [][]string{nil, nil, {"y", "z"}, nil, nil, nil, nil, nil}, 0},
		{"y waits for x's shards", [][]string{y, y, y, y, nil, nil, nil, nil}, 0},
		{"z waits before y", [][]string{nil, {"z", "y"}, nil, nil, nil, nil, nil, nil}, 1},
		{"nobody waits", make([][]string, len(leaders)), 0},
	} {
		var handed []int
		s := set("x", view(tc.waiters), &handed)
		if lo, _ := s.share(); s.held() > lo {
			s.handOverOne()
		}
		if len(handed) != tc.handed || (tc.handed == 1 && (len(tc.waiters[handed[0]]) == 0 || tc.waiters[handed[0]][0] != "z")) {
			t.Errorf("%s: x handed over %v, want %d shard(s) with z next in line", tc.name, handed, tc.handed)
		}
	}
	// A term handed over is not handed again while it ends (its last
	// state write, its resign): a 900,000-entry run logged three
	// handovers, counted as three moves, of one shard in 0.5 s.
	var handed []int
	s := set("x", view([][]string{nil, nil, nil, z, nil, nil, nil, nil}), &handed)
	for range 3 {
		s.handOverOne()
	}
	if !slices.Equal(handed, []int{3}) {
		t.Errorf("x, its term of shard 3 ending, handed over %v; want shard 3 once", handed)
	}
}
