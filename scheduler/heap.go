package scheduler

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"time"

	"github.com/beatd/beatd/config"
)

// item is an entry's next slot in the heap.
type item struct {
	e    *entry
	slot time.Time // nominal slot: the identity
	// due is slot + jitter, when to publish, in Unix nanoseconds
	// (dueNs), and key the first 8 bytes of the entry's name: a burst's
	// slots are all due at once, and comparing them through the entry's
	// name was a cache miss or three per comparison, 8% of a busy
	// leader's CPU. Both keep the item in 64 bytes, as a million are.
	due   int64
	key   uint64
	index int
}

// newItem is e's item for slot.
func newItem(e *entry, slot time.Time) *item {
	it := &item{e: e, key: nameKey(e.Name)}
	it.set(slot)
	return it
}

// set moves it to slot.
func (it *item) set(slot time.Time) {
	it.slot, it.due = slot, dueNs(slot.Add(jitter(it.e.Entry, slot)))
}

// dueTime is it's due time.
func (it *item) dueTime() time.Time { return time.Unix(0, it.due) }

// dueNs is t in Unix nanoseconds, and the last of them for a time past
// 2262 (which UnixNano cannot hold): such a slot is never due.
func dueNs(t time.Time) int64 {
	if t.After(maxDue) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

var maxDue = time.Unix(0, math.MaxInt64)

// nameKey is name's first 8 bytes, big-endian and zero-padded: two keys
// that differ order as their names do.
func nameKey(name string) uint64 {
	var b [8]byte
	copy(b[:], name)
	return binary.BigEndian.Uint64(b[:])
}

type slotHeap []*item

func (h slotHeap) Len() int { return len(h) }
func (h slotHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	switch {
	case a.due != b.due:
		return a.due < b.due
	case a.key != b.key:
		return a.key < b.key
	}
	return a.e.Name < b.e.Name
}
func (h slotHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *slotHeap) Push(x any)   { it := x.(*item); it.index = len(*h); *h = append(*h, it) }
func (h *slotHeap) Pop() any {
	old := *h
	n := len(old)
	it := old[n-1]
	old[n-1] = nil
	it.index = -1
	*h = old[:n-1]
	return it
}

// jitter delays a slot by an amount derived from (entry, slot), so every
// replica computes the same delay.
func jitter(e *config.Entry, slot time.Time) time.Duration {
	if e.Jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(e.Name))
	var b [8]byte
	n := slot.UnixNano()
	for i := range b {
		b[i] = byte(n >> (8 * i))
	}
	h.Write(b[:])
	return time.Duration(h.Sum64() % uint64(e.Jitter))
}
