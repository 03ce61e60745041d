package scheduler

import (
	"container/heap"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPrepareCompilesWhatIsDue: an idle loop compiles the templates of
// the slots due within prepareAhead, prepareBatch at a time, and none
// of the slots due later.
func TestPrepareCompilesWhatIsDue(t *testing.T) {
	var b strings.Builder
	b.WriteString("entries:\n")
	const soon, later = prepareBatch + 100, 300
	for i := range soon + later {
		fmt.Fprintf(&b, "  e%04d: {task: t, every: 1h}\n", i)
	}
	set, err := newEntrySet(mustConfig(t, b.String()))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	l := &loop{s: &Scheduler{}, set: set}
	for i, e := range set.list {
		due := now.Add(time.Duration(i%7) * 100 * time.Millisecond) // within a second
		if i >= soon {
			due = now.Add(prepareAhead + time.Duration(i)*time.Millisecond)
		}
		e.it = &item{e: e, slot: due, due: due.UnixNano(), key: nameKey(e.Name), index: len(l.heap)}
		l.heap = append(l.heap, e.it)
	}
	heap.Init(&l.heap)
	compiled := func() (in, out int) {
		for _, e := range set.list {
			if e.task == nil {
				continue
			}
			if e.it.dueTime().After(now.Add(prepareAhead)) {
				out++
			} else {
				in++
			}
		}
		return in, out
	}
	if more := l.prepare(now); !more {
		t.Fatal("a first pass over more than a batch says nothing is left")
	}
	if in, out := compiled(); in != prepareBatch || out != 0 {
		t.Fatalf("after one pass: %d due soon and %d due later compiled, want %d and 0", in, out, prepareBatch)
	}
	if more := l.prepare(now.Add(prepareAgain)); more {
		t.Fatal("a second pass left some")
	}
	if in, out := compiled(); in != soon || out != 0 {
		t.Fatalf("after two passes: %d due soon and %d due later compiled, want %d and 0", in, out, soon)
	}
	// With nothing left, the walk waits prepareEvery before it looks again.
	set.list[0].task = nil
	l.prepare(now.Add(2 * prepareAgain))
	if set.list[0].task != nil {
		t.Error("an idle walk ran again before prepareEvery")
	}
	l.prepare(now.Add(prepareEvery + 2*prepareAgain))
	if set.list[0].task == nil {
		t.Error("a walk after prepareEvery missed a slot due soon")
	}
}
