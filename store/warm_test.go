package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWarmLoad: a Load after Warm is the Load of a cold store, whatever
// the last leader wrote in between: buckets changed, emptied (their key
// deleted) or new, and a layout's move. It reads only what changed: a
// value written to a bucket's key behind etcd's revision check would not
// be seen, which the test uses to tell a bucket kept from one read.
func TestWarmLoad(t *testing.T) {
	slot := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		change func(tab *Table)
	}{
		{"nothing", func(*Table) {}},
		{"changed", func(tab *Table) {
			for i := 0; i < 600; i += 7 {
				tab.Set(EntryState{Name: fmt.Sprintf("e-%04d", i), LastSlot: slot.Add(time.Hour), Runs: 3})
			}
		}},
		{"added and deleted", func(tab *Table) {
			for i := range 50 {
				tab.Delete(fmt.Sprintf("e-%04d", i))
			}
			for i := range 40 {
				tab.Set(EntryState{Name: fmt.Sprintf("new-%04d", i), LastSlot: slot})
			}
		}},
		{"a bucket emptied", func(tab *Table) {
			b := tab.bucketOf("e-0001")
			for i := range 600 {
				if name := fmt.Sprintf("e-%04d", i); tab.bucketOf(name) == b {
					tab.Delete(name)
				}
			}
		}},
		{"every bucket", func(tab *Table) {
			for i := range 600 {
				tab.Set(EntryState{Name: fmt.Sprintf("e-%04d", i), LastSlot: slot.Add(time.Minute)})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			w := newWarmed(t, slot)
			s, g, cold := w.s, w.g, New(w.cli, w.pfx)
			// The last leader goes on writing, from its own table.
			last, err := cold.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tc.change(last)
			if err := cold.Save(ctx, g, last, nil); err != nil {
				t.Fatal(err)
			}
			want, err := cold.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got.Len() != want.Len() {
				t.Fatalf("Load after Warm: %d entries, want %d", got.Len(), want.Len())
			}
			for name, w := range want.States() {
				if g, _ := got.Get(name); g.LastSlot != w.LastSlot || g.Runs != w.Runs {
					t.Fatalf("%s after Warm: %+v, want %+v", name, g, *w)
				}
			}
			if s.takeWarm() != nil {
				t.Fatal("Load kept what Warm read")
			}
		})
	}
}

// TestWarmReadsOnlyChanges: a bucket whose revision is the one Warm read
// is taken from Warm's copy, and one written since from etcd; so Load
// after Warm reads what the last leader wrote, not the table again.
func TestWarmReadsOnlyChanges(t *testing.T) {
	ctx := context.Background()
	slot := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	w := newWarmed(t, slot)
	cli, s, tab := w.cli, w.s, w.tab
	// Warm's copy of two buckets is marked (one entry's slot changed);
	// the store keeps a copy only while etcd's key is at the revision
	// Warm read, and the last leader writes one of the two again.
	marked := slot.Add(time.Hour)
	kept := "e-0001"
	moved := ""
	for i := range 600 {
		if n := fmt.Sprintf("e-%04d", i); tab.bucketOf(n) != tab.bucketOf(kept) {
			moved = n
			break
		}
	}
	for _, name := range []string{kept, moved} {
		copyOf := NewTable()
		tab.Range(func(st EntryState) bool {
			if st.Name == name {
				st.LastSlot = marked
			}
			copyOf.Set(st)
			return true
		})
		b := tab.bucketOf(name)
		w := s.warm.buckets[tab.suffix(b)]
		w.value = copyOf.appendBucket(nil, b)
		s.warm.buckets[tab.suffix(b)] = w
	}
	b := tab.bucketOf(moved)
	if _, err := cli.Put(ctx, s.bucketPrefix()+tab.suffix(b), string(tab.appendBucket(nil, b))); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := got.Get(kept); !st.LastSlot.Equal(marked) {
		t.Error("a bucket unchanged since Warm was read again, not taken from Warm's copy")
	}
	if st, _ := got.Get(moved); !st.LastSlot.Equal(slot) {
		t.Error("a bucket written since Warm was taken from Warm's stale copy")
	}
}

// warmed is a store of 600 entries at one slot, saved under a leader's
// fence and then read by Warm.
type warmed struct {
	cli *clientv3.Client
	pfx string
	g   election.Fence
	s   *Store
	tab *Table // what was saved
}

func newWarmed(t *testing.T, slot time.Time) warmed {
	t.Helper()
	ctx := context.Background()
	w := warmed{cli: newClient(t), pfx: testPrefix(t)}
	w.g, w.s, w.tab = lead(t, w.cli, w.pfx), New(w.cli, w.pfx), NewTable()
	for i := range 600 {
		w.tab.Set(EntryState{Name: fmt.Sprintf("e-%04d", i), LastSlot: slot})
	}
	if err := w.s.Save(ctx, w.g, w.tab, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	return w
}
