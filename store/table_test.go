package store

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"
)

func sameState(a, b EntryState) bool {
	return a.Name == b.Name && a.LastSlot.Equal(b.LastSlot) && a.Since.Equal(b.Since) &&
		a.RemovedAt.Equal(b.RemovedAt) && a.Paused == b.Paused
}

func TestBucketRoundTrip(t *testing.T) {
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	tests := []EntryState{
		{Name: "zero"},
		{Name: "slot", LastSlot: base},
		{Name: "nanos", LastSlot: base.Add(500 * time.Millisecond), Since: base.Add(-time.Nanosecond)},
		{Name: "paused", LastSlot: base.Add(-90 * 24 * time.Hour), Paused: true},
		{Name: "removed", RemovedAt: base.Add(time.Hour), Since: base.Add(-400 * 24 * time.Hour)},
		{Name: "before 1970", LastSlot: time.Date(1960, 1, 1, 0, 0, 0, 1, time.UTC)},
		{Name: "zone", LastSlot: base.In(time.FixedZone("x", 3600))},
		{Name: "ünïcødé ✓", LastSlot: base, Since: base, Paused: true, RemovedAt: base},
	}
	tab := NewTable()
	for _, st := range tests {
		tab.Set(st)
	}
	got := NewTable()
	for b := range NumBuckets {
		if len(tab.open(b)) == 0 {
			continue
		}
		if err := got.loadBucket(tab.appendBucket(nil, b)); err != nil {
			t.Fatalf("bucket %d: %v", b, err)
		}
	}
	if got.Len() != len(tests) || got.Dirty() != 0 {
		t.Fatalf("loaded %d entries with %d dirty buckets, want %d clean", got.Len(), got.Dirty(), len(tests))
	}
	for _, want := range tests {
		if st, ok := got.Get(want.Name); !ok || !sameState(st, want) {
			t.Errorf("%q: decoded %+v, want %+v", want.Name, st, want)
		}
	}
	// Into another layout, each bucket's records go to their own buckets
	// (enough of them that a bucket holds several).
	many := slices.Clone(tests)
	for i := range 2000 {
		many = append(many, EntryState{Name: fmt.Sprintf("tenant-%04d", i), LastSlot: base.Add(time.Duration(i) * time.Second)})
	}
	src, other := NewTable(), newTable(3)
	for _, st := range many {
		src.Set(st)
	}
	for b := range NumBuckets {
		if len(src.open(b)) == 0 {
			continue
		}
		if err := other.loadBucket(src.appendBucket(nil, b)); err != nil {
			t.Fatalf("bucket %d into 3 digits: %v", b, err)
		}
	}
	if other.Len() != len(many) {
		t.Fatalf("loaded %d entries into 3 digits, want %d", other.Len(), len(many))
	}
	for _, want := range many {
		if st, ok := other.Get(want.Name); !ok || !sameState(st, want) {
			t.Errorf("%q in 3 digits: decoded %+v, want %+v", want.Name, st, want)
		}
	}
	// Changing an encoded bucket decodes it, and keeps its neighbours.
	got.Set(EntryState{Name: "zero", Paused: true})
	if st, _ := got.Get("zero"); !st.Paused || got.Dirty() != 1 || got.Len() != len(tests) {
		t.Errorf("after a change: %+v, %d dirty, %d entries", st, got.Dirty(), got.Len())
	}
	got.MarkClean()
	if st, _ := got.Get("zero"); !st.Paused || got.Dirty() != 0 || len(got.States()) != len(tests) {
		t.Errorf("after a write: %+v, %d dirty, %d states", st, got.Dirty(), len(got.States()))
	}
}

func TestBucketCorruptRefused(t *testing.T) {
	for _, b := range [][]byte{{2}, {2, 0, 5, 'a'}, {2, 0, 1, 'a', flagLast}, {2, 0, 1, 'a', flagLast, 1, 0xff, 0xff, 0xff, 0xff, 0xff}, {1, 0}} {
		if err := NewTable().loadBucket(b); err == nil {
			t.Errorf("decoded %v without an error", b)
		}
	}
}

// TestBytesPerEntry measures the encoding: a table of entries that fire
// every second, as etcd receives it on every state write.
func TestBytesPerEntry(t *testing.T) {
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, n := range []int{1000, 20000} {
		tab := NewTable()
		for i := range n {
			tab.Set(EntryState{Name: fmt.Sprintf("entry-%05d", i), LastSlot: base.Add(time.Duration(i%3) * time.Second), Since: base.Add(-time.Hour)})
		}
		total := 0
		for b := range NumBuckets {
			total += len(tab.appendBucket(nil, b))
		}
		per := float64(total) / float64(n)
		t.Logf("%d entries: %d bytes in %d buckets, %.1f bytes per entry (name 11)", n, total, NumBuckets, per)
		// name (11) + its length + flags + two short times.
		if per > 24 {
			t.Errorf("%.1f bytes per entry: the encoding grew", per)
		}
	}
}

func TestPrune(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	tab := NewTable()
	tab.Set(EntryState{Name: "kept"})
	tab.Set(EntryState{Name: "gone"})
	tab.Set(EntryState{Name: "back", RemovedAt: now.Add(-time.Minute)})
	configured := func(n string) bool { return n == "kept" || n == "back" }
	marked, deleted := tab.Prune(configured, now, time.Hour)
	if fmt.Sprint(marked, deleted) != "[gone] []" {
		t.Fatalf("marked %v, deleted %v", marked, deleted)
	}
	if st, _ := tab.Get("gone"); !st.RemovedAt.Equal(now) {
		t.Fatalf("removed entry not marked: %+v", st)
	}
	if st, _ := tab.Get("back"); !st.RemovedAt.IsZero() {
		t.Fatalf("an entry back in the config is still marked removed: %+v", st)
	}
	// Within the grace period: kept. After it: deleted.
	if _, deleted = tab.Prune(configured, now.Add(30*time.Minute), time.Hour); len(deleted) != 0 {
		t.Fatalf("deleted within the grace period: %v", deleted)
	}
	if _, deleted = tab.Prune(configured, now.Add(2*time.Hour), time.Hour); fmt.Sprint(deleted) != "[gone]" {
		t.Fatalf("after grace deleted %v", deleted)
	}
	if _, ok := tab.Get("gone"); ok || tab.Len() != 2 || len(tab.States()) != 2 {
		t.Fatalf("after grace: %d entries", tab.Len())
	}
}

// TestEntryStateFitsItsAllocation: a leader holds every entry's state,
// and EntryState's bools sit together to fit a 112-byte allocation.
func TestEntryStateFitsItsAllocation(t *testing.T) {
	if n := unsafe.Sizeof(EntryState{}); n > 112 {
		t.Errorf("store.EntryState is %d bytes, over the 112-byte size class", n)
	}
}

// TestTableKeepsHotBuckets: a bucket changed past maxAdd in a cycle is
// decoded, and keeps its map while it is written in cycle after cycle; a
// bucket a few of whose entries change in every cycle (a shard's
// catch-up) keeps none.
func TestTableKeepsHotBuckets(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	tb := NewTable()
	const n = 20000 // ~78 a bucket
	for i := range n {
		tb.Set(EntryState{Name: fmt.Sprintf("e%d", i), LastSlot: at})
	}
	hot, few := tb.bucketOf("e7"), -1
	var hotNames []string
	for i := range n {
		name := fmt.Sprintf("e%d", i)
		switch b := tb.bucketOf(name); {
		case b == hot:
			hotNames = append(hotNames, name)
		case few < 0:
			few = b
		}
	}
	if len(hotNames) <= maxAdd {
		t.Fatalf("the hot bucket holds %d entries, not more than maxAdd (%d)", len(hotNames), maxAdd)
	}
	fewName := ""
	for i := range n {
		if name := fmt.Sprintf("e%d", i); tb.bucketOf(name) == few {
			fewName = name
			break
		}
	}
	write := func() { // as Store.Save then the persister's Compact
		for b := range tb.enc {
			if tb.dirty[b] {
				tb.written(b, tb.appendBucket(nil, b))
			}
		}
		tb.Compact()
	}
	decoded := func() (n int) {
		for _, m := range tb.dec {
			if m != nil {
				n++
			}
		}
		return n
	}
	write() // first cycle: every bucket written once, none kept
	if n := decoded(); n != 0 {
		t.Fatalf("after a first write %d buckets stay decoded, want 0", n)
	}
	for cycle := 1; cycle <= 3; cycle++ {
		slot := at.Add(time.Duration(cycle) * time.Second)
		for _, name := range hotNames {
			tb.Set(EntryState{Name: name, LastSlot: slot, Runs: uint64(cycle)})
		}
		tb.Set(EntryState{Name: fewName, LastSlot: slot, Runs: uint64(cycle)})
		if tb.dec[few] != nil {
			t.Fatalf("cycle %d: one change decoded its bucket", cycle)
		}
		write()
		// Changed past maxAdd, written in this cycle and the one before:
		// kept. The other, written as often, holds no map.
		if cycle > 1 && (decoded() != 1 || tb.dec[hot] == nil) {
			t.Fatalf("cycle %d: %d buckets decoded (hot one: %v), want only the hot one", cycle, decoded(), tb.dec[hot] != nil)
		}
		for _, name := range []string{"e7", fewName} {
			if st, _ := tb.Get(name); !st.LastSlot.Equal(slot) || st.Runs != uint64(cycle) {
				t.Fatalf("cycle %d: %s is %+v", cycle, name, st)
			}
		}
	}
	write() // a cycle that does not write it: back to its encoding
	if n := decoded(); n != 0 {
		t.Fatalf("a bucket not written in a cycle stays decoded (%d)", n)
	}
	if st, _ := tb.Get("e7"); !st.LastSlot.Equal(at.Add(3 * time.Second)) {
		t.Fatalf("after dropping its map, e7's slot %v", st.LastSlot)
	}
	if tb.Len() != n {
		t.Fatalf("Len %d, want %d", tb.Len(), n)
	}
}

// TestTableAppendsNewEntries: a new entry's state, and a stored entry's
// new one, join an encoded bucket without decoding it, and are read,
// replaced, listed and written as any other, in the format they need;
// past maxAdd changes the bucket is decoded.
func TestTableAppendsNewEntries(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	write := func(tb *Table) {
		for b := range tb.enc {
			if tb.dirty[b] {
				tb.written(b, tb.appendBucket(nil, b))
			}
		}
		tb.Compact()
	}
	for _, tc := range []struct {
		name   string
		stored EntryState // the bucket's first, stored record
	}{
		{"plain stored record", EntryState{Name: "old", LastSlot: at, Since: at.Add(-time.Hour)}},
		{"stored record with outcomes (format 3)", EntryState{Name: "old", LastSlot: at, Runs: 3,
			Out: &Outcomes{}}},
		{"stored record without a slot (base 0)", EntryState{Name: "old", Since: at}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTable(2)
			tb.Set(tc.stored)
			write(tb)
			b := tb.bucketOf("old")
			// Names that hash to old's bucket.
			var names []string
			for i := 0; len(names) < 3; i++ {
				if n := fmt.Sprintf("new%d", i); tb.bucketOf(n) == b {
					names = append(names, n)
				}
			}
			want := map[string]EntryState{"old": tc.stored}
			for i, n := range names {
				st := EntryState{Name: n, Since: at.Add(time.Duration(i) * time.Second), LastSlot: at.Add(-time.Duration(i) * 24 * time.Hour)}
				tb.Set(st)
				want[n] = st
			}
			// Replaced before its first write, with nanoseconds.
			re := EntryState{Name: names[0], Since: at.Add(1500 * time.Millisecond), Paused: true}
			tb.Set(re)
			want[re.Name] = re
			if tb.dec[b] != nil {
				t.Fatal("adding new entries decoded the bucket")
			}
			if tb.Len() != len(want) || tb.Dirty() != 1 {
				t.Fatalf("Len %d, %d dirty; want %d and 1", tb.Len(), tb.Dirty(), len(want))
			}
			check := func(when string) {
				t.Helper()
				seen := 0
				tb.Range(func(st EntryState) bool { seen++; return true })
				if seen != len(want) {
					t.Errorf("%s: Range saw %d entries, want %d", when, seen, len(want))
				}
				for n, w := range want {
					if st, ok := tb.Get(n); !ok || !sameState(st, w) || st.Runs != w.Runs || (st.Out == nil) != (w.Out == nil) {
						t.Errorf("%s: %q is %+v (%v), want %+v", when, n, st, ok, w)
					}
				}
			}
			check("before the write")
			write(tb)
			if tb.dec[b] != nil || len(tb.add[b]) != 0 {
				t.Fatal("the write left the bucket decoded or its additions pending")
			}
			check("after the write")
			// What etcd holds reads back whole.
			recs, err := DecodeBucket(tb.enc[b])
			if err != nil || len(recs) != len(want) {
				t.Fatalf("stored bucket: %d records, %v; want %d", len(recs), err, len(want))
			}
			// Changes to stored entries (one with a run count, which a
			// format-2 bucket cannot hold) stay beside the encoding.
			tb.Set(EntryState{Name: names[1], LastSlot: at.Add(time.Minute)})
			want[names[1]] = EntryState{Name: names[1], LastSlot: at.Add(time.Minute)}
			tb.Set(EntryState{Name: "old", LastSlot: at.Add(2 * time.Minute), Runs: 9})
			want["old"] = EntryState{Name: "old", LastSlot: at.Add(2 * time.Minute), Runs: 9}
			if tb.dec[b] != nil || tb.Len() != len(want) {
				t.Fatalf("a stored entry's change: decoded %v, Len %d", tb.dec[b] != nil, tb.Len())
			}
			check("after a change")
			write(tb)
			if tb.dec[b] != nil {
				t.Fatal("writing a stored entry's change kept the bucket decoded")
			}
			check("after the change's write")
			// Past maxAdd changes, the bucket is decoded.
			for i := 0; len(tb.add[b]) < maxAdd; i++ {
				if n := fmt.Sprintf("more%d", i); tb.bucketOf(n) == b {
					tb.Set(EntryState{Name: n, Since: at})
					want[n] = EntryState{Name: n, Since: at}
				}
			}
			tb.Set(EntryState{Name: "old", LastSlot: at.Add(3 * time.Minute)})
			want["old"] = EntryState{Name: "old", LastSlot: at.Add(3 * time.Minute)}
			if tb.dec[b] == nil || tb.Len() != len(want) {
				t.Fatalf("past maxAdd: decoded %v, Len %d (want %d)", tb.dec[b] != nil, tb.Len(), len(want))
			}
			check("past maxAdd")
			tb.Delete("old")
			delete(want, "old")
			write(tb)
			check("after a delete")
		})
	}
}

func TestHasRecord(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	tb := newTable(2)
	sts := []EntryState{{Name: "a"}, {Name: "bb", LastSlot: at, Since: at, RemovedAt: at.Add(time.Nanosecond)},
		{Name: "ccc", Runs: 7, Out: &Outcomes{}, Paused: true}}
	m := map[string]EntryState{}
	for _, st := range sts {
		m[st.Name] = st
	}
	tb.dec[0] = m
	enc := tb.appendBucket(nil, 0)
	for _, tc := range []struct {
		name string
		want bool
	}{{"a", true}, {"bb", true}, {"ccc", true}, {"b", false}, {"cc", false}, {"", false}, {"dddd", false}} {
		if got := hasRecord(enc, tc.name); got != tc.want {
			t.Errorf("hasRecord(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
	if hasRecord(nil, "a") || hasRecord([]byte{9, 0}, "a") {
		t.Error("hasRecord found a name in an empty or unreadable bucket")
	}
}

// BenchmarkTableBulkAdd: one write cycle of a bulk load at a million
// entries: 25,000 new entries (five seconds of a load) join a table whose
// buckets are stored encoded, and every dirty bucket is encoded for its
// write.
func BenchmarkTableBulkAdd(b *testing.B) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	base := NewTable()
	for i := range 1_000_000 {
		base.Set(EntryState{Name: fmt.Sprintf("tenant-%07d", i), Since: at, LastSlot: at})
	}
	base.Fit()
	base.MarkClean()
	base.Compact()
	base.Compact()
	enc := make([][]byte, len(base.enc))
	copy(enc, base.enc)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		tb := newTable(base.digits)
		copy(tb.enc, enc)
		tb.n = base.n
		b.StartTimer()
		for j := range 25_000 {
			tb.Set(EntryState{Name: fmt.Sprintf("new-%d-%07d", i, j), Since: at})
		}
		for bk := range tb.enc {
			if tb.dirty[bk] {
				tb.written(bk, tb.appendBucket(nil, bk))
			}
		}
		tb.Compact()
	}
}

// BenchmarkShardFires: one second of a sharded replica's steady state in
// one shard's table: 400 of a shard's 56,250 entries (900,000 over 16
// shards) fire, and every bucket they dirtied is encoded for its write.
// The bytes a fire writes are what etcd's history grows by and, with
// the encoding's copies, most of what the steady state allocates.
func BenchmarkShardFires(b *testing.B) {
	const n, fires = 56_250, 400
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	names := make([]string, n)
	tb := NewTable()
	for i := range n {
		names[i] = fmt.Sprintf("tenant-%07d", i*16)
		tb.Set(EntryState{Name: names[i], Since: at, LastSlot: at})
	}
	tb.Fit()
	tb.MarkClean()
	tb.Compact()
	tb.Compact()
	rng := rand.New(rand.NewPCG(1, 2))
	written := 0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		slot := at.Add(time.Duration(i+1) * time.Second)
		for range fires {
			tb.Set(EntryState{Name: names[rng.IntN(n)], Since: at, LastSlot: slot})
		}
		for bk := range tb.enc {
			if tb.dirty[bk] {
				enc := tb.appendBucket(nil, bk)
				written += len(enc)
				tb.written(bk, enc)
			}
		}
		tb.Compact()
	}
	b.ReportMetric(float64(written)/float64(b.N*fires), "written-B/fire")
	b.ReportMetric(float64(tb.Buckets()), "buckets")
}
