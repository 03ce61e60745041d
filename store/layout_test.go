package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestLayoutDigits(t *testing.T) {
	for _, tc := range []struct{ n, cur, want int }{
		{0, 2, 2},
		{32768, 2, 2},
		{32769, 2, 3},
		{56250, 2, 3}, // a shard of 900,000 entries over 16
		{1 << 20, 2, 4},
		{1<<20 + 1, 3, 4},
		{20000, 3, 3},  // above half the small layout's capacity: stays
		{16384, 3, 2},  // at half: moves back
		{600000, 4, 4}, // above half of 4,096 buckets' capacity
		{100000, 4, 3},
	} {
		if got := layoutDigits(tc.n, tc.cur); got != tc.want {
			t.Errorf("layoutDigits(%d, %d) = %d, want %d", tc.n, tc.cur, got, tc.want)
		}
	}
}

// bucketKeys counts the stored state keys by layout (hex digits).
func bucketKeys(t *testing.T, cli *clientv3.Client, s *Store) map[int]int {
	t.Helper()
	resp, err := cli.Get(context.Background(), s.bucketPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, kv := range resp.Kvs {
		suffix, ok := BucketAt(s.prefix, kv.Key)
		if !ok {
			t.Fatalf("a state key of no layout: %s", kv.Key)
		}
		out[len(suffix)]++
	}
	return out
}

// TestLayoutMove: a table that grows past 32,768 entries moves to 4,096
// buckets, written whole, and the old keys go; one that was moving when
// its leader died (both layouts stored) loads each entry from the key
// written last and finishes the move.
func TestLayoutMove(t *testing.T) {
	cli := newClient(t)
	pfx := testPrefix(t)
	s := New(cli, pfx)
	ctx := context.Background()
	g := lead(t, cli, pfx)
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	const n = 40000
	tab := NewTable()
	for i := range n {
		tab.Set(EntryState{Name: fmt.Sprintf("tenant-%06d", i), LastSlot: slot.Add(time.Duration(i) * time.Second)})
	}
	if tab.Fit(); tab.Buckets() != 4096 {
		t.Fatalf("%d entries in %d buckets, want 4096", n, tab.Buckets())
	}
	// Stored first in the small layout, as a table that grew would be.
	small := newTable(2)
	tab.Range(func(st EntryState) bool { small.Set(st); return true })
	if err := s.Save(ctx, g, small, nil); err != nil {
		t.Fatal(err)
	}
	if got := bucketKeys(t, cli, s); got[2] != 256 || len(got) != 1 {
		t.Fatalf("keys by layout %v, want 256 of 2 digits", got)
	}
	loaded, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Fit() || loaded.Buckets() != 4096 {
		t.Fatalf("loaded %d entries: Fit left %d buckets", loaded.Len(), loaded.Buckets())
	}
	// A half-done move: some of the new layout written, with newer
	// state for some entries, the old keys still there.
	newer := slot.Add(100 * 24 * time.Hour)
	part := newTable(3)
	for b := 0; b < 40; b++ {
		loaded.Range(func(st EntryState) bool {
			if part.bucketOf(st.Name) == b {
				st.LastSlot = newer
				part.Set(st)
			}
			return true
		})
	}
	if err := s.Save(ctx, g, part, nil); err != nil {
		t.Fatal(err)
	}
	if got := bucketKeys(t, cli, s); got[2] != 256 || got[3] != 40 {
		t.Fatalf("keys by layout %v, want 256 old and 40 new", got)
	}
	mid, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mid.Len() != n || mid.Buckets() != 4096 {
		t.Fatalf("half-moved table loaded %d entries in %d buckets", mid.Len(), mid.Buckets())
	}
	moved := 0
	mid.Range(func(st EntryState) bool {
		if st.LastSlot.Equal(newer) {
			moved++
		}
		return true
	})
	var want int
	part.Range(func(EntryState) bool { want++; return true })
	if moved != want {
		t.Fatalf("%d entries have the newer state, want %d (the half-moved copies)", moved, want)
	}
	probe := ""
	part.Range(func(st EntryState) bool { probe = st.Name; return false })
	if st, err := s.Get(ctx, probe); err != nil || !st.LastSlot.Equal(newer) {
		t.Fatalf("Get(%s) mid-move = %+v, %v; want the newer copy", probe, st, err)
	}
	if err := s.Save(ctx, g, mid, nil); err != nil {
		t.Fatal(err)
	}
	if got := bucketKeys(t, cli, s); got[3] != 4096 || len(got) != 1 {
		t.Fatalf("after the move keys by layout %v, want 4096 of 3 digits only", got)
	}
	final, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if final.Len() != n || final.Buckets() != 4096 || final.Dirty() != 0 {
		t.Fatalf("final table: %d entries, %d buckets, %d dirty", final.Len(), final.Buckets(), final.Dirty())
	}
	if st, err := s.Get(ctx, "tenant-000042"); err != nil || st.LastSlot.IsZero() {
		t.Fatalf("Get after the move = %+v, %v", st, err)
	}
	// Shrinking back is the same move the other way, once well below.
	for i := range n - 16000 {
		final.Delete(fmt.Sprintf("tenant-%06d", i))
	}
	if !final.Fit() || final.Buckets() != 256 {
		t.Fatalf("16,000 entries left in %d buckets, want 256", final.Buckets())
	}
	if err := s.Save(ctx, g, final, nil); err != nil {
		t.Fatal(err)
	}
	if got := bucketKeys(t, cli, s); got[2] == 0 || len(got) != 1 {
		t.Fatalf("after shrinking keys by layout %v, want 2 digits only", got)
	}
}
