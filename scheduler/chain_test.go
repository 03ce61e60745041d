package scheduler

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	beatdtest "github.com/beatd/beatd/testkit/testutil"
)

// startedDispatcher signals each Publish's start, by its number.
type startedDispatcher struct {
	*fakeDispatcher
	mu      sync.Mutex
	calls   int
	started map[int]chan struct{}
}

func (d *startedDispatcher) startedCh(n int) chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started[n] == nil {
		d.started[n] = make(chan struct{})
	}
	return d.started[n]
}

func (d *startedDispatcher) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	d.mu.Lock()
	d.calls++
	n := d.calls
	d.mu.Unlock()
	close(d.startedCh(n))
	return d.fakeDispatcher.Publish(ctx, token, fires, results)
}

// TestBurstGoesOutBeforeItIsRecorded: a burst's batches go to the broker
// back to back, and the loop records them (states, metrics, observers)
// only after the last is out (publishPending). When the first batch's
// fire is observed, the third publish has started; a loop that recorded
// each batch before publishing the next would not have started it.
func TestBurstGoesOutBeforeItIsRecorded(t *testing.T) {
	h := newHarness(t, "entries:\n  a: {task: t, every: 10s, relative: true}\n  b: {task: t, every: 10s, relative: true}\n  c: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	d := &startedDispatcher{fakeDispatcher: h.disp, started: map[int]chan struct{}{}}
	h.sched.cfg.Dispatcher = d
	h.sched.cfg.BatchSize = 1
	var mu sync.Mutex
	var observed []string
	h.sched.cfg.Observer = func(entry string, _ time.Time, _ broker.Result, _ time.Duration, _ bool) {
		third := false
		select {
		case <-d.startedCh(3):
			third = true
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		observed = append(observed, fmt.Sprintf("%s third=%v", entry, third))
	}
	h.start(7)
	h.settle()
	setClock(h.clock, t0.Add(10*time.Second))
	got := h.waitPublished(3)
	want := []string{"a 2026-11-30T10:00:10Z", "b 2026-11-30T10:00:10Z", "c 2026-11-30T10:00:10Z"}
	if !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	eventually(t, 5*time.Second, "three fires observed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(observed) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	if wantObs := []string{"a third=true", "b third=true", "c third=true"}; !slices.Equal(observed, wantObs) {
		t.Fatalf("observed %v, want %v: a batch was recorded before the burst was out", observed, wantObs)
	}
}

// failOnceDispatcher fails one fire, the first time it is published.
type failOnceDispatcher struct {
	*fakeDispatcher
	mu     sync.Mutex
	target string // "entry slot"
	done   bool
}

func (d *failOnceDispatcher) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	d.mu.Lock()
	fail := false
	for i := range fires {
		if !d.done && fires[i].Task.Name+" "+fires[i].Slot.UTC().Format(time.RFC3339) == d.target {
			d.done, fail = true, true
		}
	}
	d.mu.Unlock()
	if fail {
		for i := range results {
			results[i] = broker.ResultError
		}
		return errors.New("connection reset")
	}
	return d.fakeDispatcher.Publish(ctx, token, fires, results)
}

// TestChainKeepsEntryOrderOnFailure: a clock step leaves several slots
// of each entry pending (catchup: all), one batch after another. The
// first of x's fails once: it goes out again before any later slot of x,
// which would otherwise take the entry's mark past it (and Redis would
// call it a duplicate). A batch that shares an entry with the one in
// flight waits for it.
func TestChainKeepsEntryOrderOnFailure(t *testing.T) {
	h := newHarness(t, "entries:\n  x: {task: t, every: 10s, relative: true, catchup: all, catchup_window: 10m}\n  y: {task: t, every: 10s, relative: true, catchup: all, catchup_window: 10m}\n", t0.Add(time.Second))
	d := &failOnceDispatcher{fakeDispatcher: h.disp, target: "x 2026-11-30T10:00:10Z"}
	h.sched.cfg.Dispatcher = d
	h.sched.cfg.BatchSize = 1
	h.start(7)
	h.settle()
	setClock(h.clock, t0.Add(time.Minute)) // past stepLateness: a step
	beatdtest.EventuallyEvery(t, 10*time.Second, 2*time.Millisecond, "both entries' six slots", func() bool {
		if len(h.disp.list()) >= 12 {
			return true
		}
		h.clock.Advance(100 * time.Millisecond) // past the retry backoff
		return false
	})
	var last = map[string]string{}
	for _, k := range h.disp.list() {
		name, slot := k[:1], k[2:]
		if slot <= last[name] {
			t.Fatalf("published %v: %s's slot %s after %s", h.disp.list(), name, slot, last[name])
		}
		last[name] = slot
	}
	if !d.done {
		t.Fatal("the fire meant to fail was never published")
	}
}

// weakTasks records a weak pointer to every template it publishes.
type weakTasks struct {
	*fakeDispatcher
	mu    sync.Mutex
	tasks []weak.Pointer[celery.Task]
}

func (d *weakTasks) Publish(ctx context.Context, token int64, fires []celery.Fire, results []broker.Result) error {
	d.mu.Lock()
	for _, f := range fires {
		d.tasks = append(d.tasks, weak.Make(f.Task))
	}
	d.mu.Unlock()
	return d.fakeDispatcher.Publish(ctx, token, fires, results)
}

// TestBurstLeavesNoTemplateAlive: once a burst is recorded, the templates
// its entries dropped (their next slot an hour away) are garbage: the
// publications kept for the next burst hold their arrays, not the fires'
// templates. Before, each kept publication held up to a batch of them
// (~60 MB at 900,000 entries).
func TestBurstLeavesNoTemplateAlive(t *testing.T) {
	var b strings.Builder
	b.WriteString("entries:\n")
	const n = 40
	for i := range n {
		fmt.Fprintf(&b, "  e%02d: {task: t, every: 1h, relative: true}\n", i)
	}
	h := newHarness(t, b.String(), t0.Add(time.Second))
	d := &weakTasks{fakeDispatcher: h.disp}
	h.sched.cfg.Dispatcher = d
	h.sched.cfg.BatchSize = 4 // a chain of ten batches
	h.start(7)
	h.settle()
	setClock(h.clock, t0.Add(time.Hour))
	h.waitPublished(n)
	h.settle()
	eventually(t, 5*time.Second, "every published template collected", func() bool {
		runtime.GC()
		d.mu.Lock()
		defer d.mu.Unlock()
		alive := 0
		for _, w := range d.tasks {
			if w.Value() != nil {
				alive++
			}
		}
		return len(d.tasks) >= n && alive == 0
	})
}
