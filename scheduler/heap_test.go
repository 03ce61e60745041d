package scheduler

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
)

// TestHeapOrder pops slots due at the same instants in (due, name) order,
// for names that share their first 8 bytes, are prefixes of each other,
// or hold a NUL where the key pads with zeros.
func TestHeapOrder(t *testing.T) {
	names := []string{"a", "ab", "ab\x00", "ab\x00c", "tenant-000001-sync", "tenant-000001-report",
		"tenant-0", "tenant-00", "tenant-000002", "z", "Z", "éa", "e\xff", "", "12345678", "123456789"}
	base := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		var h slotHeap
		type want struct {
			due  time.Time
			name string
		}
		var all []want
		for _, n := range names {
			due := base.Add(time.Duration(r.IntN(3)) * time.Second)
			e := &entry{Entry: &config.Entry{Name: n}}
			it := newItem(e, due)
			heap.Push(&h, it)
			all = append(all, want{due, n})
		}
		slices.SortFunc(all, func(a, b want) int {
			if c := a.due.Compare(b.due); c != 0 {
				return c
			}
			return strings.Compare(a.name, b.name)
		})
		for i, w := range all {
			it := heap.Pop(&h).(*item)
			if it.e.Name != w.name || !it.dueTime().Equal(w.due) {
				t.Fatalf("round %d: pop %d = %q at %v, want %q at %v", round, i, it.e.Name, it.dueTime(), w.name, w.due)
			}
		}
	}
}

// TestDueNsPastRange: a slot past what UnixNano holds is never due.
func TestDueNsPastRange(t *testing.T) {
	far := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := dueNs(far); got <= dueNs(time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("dueNs(2300) = %d, not after 2262", got)
	}
}
