package scheduler

import (
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/store"
)

type observed struct {
	entry  string
	slot   time.Time
	result broker.Result
	lag    time.Duration
	manual bool
}

// TestObserverSeesEveryFire: the optional Observer is called once per fire,
// with its slot, result, lag and whether it was manual, so the console's
// timeline counts exactly what was published.
func TestObserverSeesEveryFire(t *testing.T) {
	h := newHarness(t, "entries:\n  e: {task: t, every: 10s, relative: true}\n", t0.Add(time.Second))
	var mu sync.Mutex
	var got []observed
	h.sched.cfg.Observer = func(entry string, slot time.Time, r broker.Result, lag time.Duration, manual bool) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, observed{entry, slot, r, lag, manual})
	}
	h.start(7)
	h.settle()
	setClock(h.clock, t0.Add(12*time.Second)) // the 10:00:10 slot, 2 s late
	h.waitPublished(1)
	h.settle()
	h.store.request(store.OpTrigger, "e")
	h.waitPublished(2)
	h.settle()

	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("observer saw %d fires, want 2: %+v", len(got), got)
	}
	if o := got[0]; o.entry != "e" || !o.slot.Equal(t0.Add(10*time.Second)) || o.result != broker.ResultOK || o.lag != 2*time.Second || o.manual {
		t.Errorf("scheduled fire observed as %+v", o)
	}
	if o := got[1]; o.entry != "e" || o.result != broker.ResultOK || !o.manual {
		t.Errorf("manual fire observed as %+v", o)
	}
}
