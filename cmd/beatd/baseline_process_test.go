package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/chaos"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/store"
)

// TestProcessKilledRightAfterEntriesApplied: kill -9 of the leader right
// after it applied 2,000 runtime entries through the entries API, before
// it took in (or stored a baseline for) the newest of them. The next
// leader, started a second later, owes every entry its slots from when
// its definition was written: every slot from the end of the writes is
// in the queue exactly once, and none from before an entry existed.
func TestProcessKilledRightAfterEntriesApplied(t *testing.T) {
	c := newCluster(t, "entries:\n  probe: {task: tasks.add, every: 1s, catchup: all}\n", 1)
	lead, _ := c.leader("", 20*time.Second)
	const (
		batches = 20
		batch   = 100
		entries = batches*batch + 1
		spec    = `{"task": "tasks.add", "every": "1s", "catchup": "all"}`
	)
	written := map[string]time.Time{} // when each entry's write began
	for b := range batches {
		set := map[string]json.RawMessage{}
		for j := range batch {
			name := fmt.Sprintf("tenant-%05d", b*batch+j)
			set[name] = json.RawMessage(spec)
			written[name] = time.Now()
		}
		body, err := json.Marshal(map[string]any{"entries": set})
		if err != nil {
			t.Fatal(err)
		}
		if r := call(t, "POST", lead.URL("/api/v1/entries"), "test-token", body); r.code != 200 {
			t.Fatalf("apply batch %d: %d %s", b, r.code, r.body)
		}
	}
	// The first slot every entry owes: the whole second after the last
	// write.
	from := time.Now().Truncate(time.Second).Add(time.Second)
	lead.Signal(syscall.SIGKILL)
	<-lead.Done()
	table, err := store.New(c.observer, c.prefix).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leader killed with %d of %d entries' states written", table.Len(), entries)
	time.Sleep(time.Second) // slots fall due while no leader runs
	c.startReplica("r1").waitHealthy()
	c.leader(lead.ID, 20*time.Second)
	to := time.Now().Truncate(time.Second).Add(2 * time.Second)
	waitFor(t, 30*time.Second, "every entry's slot at the audit's end published", func() bool {
		n := 0
		for _, m := range c.audit("celery") {
			if m.Slot.Equal(to) {
				n++
			}
		}
		return n >= entries
	})
	msgs := c.audit("celery")
	for _, m := range msgs {
		if w, ok := written[m.Entry]; ok && !m.Slot.After(w.Truncate(time.Second)) {
			t.Errorf("%s published for %s, written at %s", m.Entry, m.Slot.Format(time.RFC3339Nano), w.Format(time.RFC3339Nano))
		}
	}
	cfg, err := config.LoadFile(c.config)
	if err != nil {
		t.Fatal(err)
	}
	list := slices.Clone(cfg.Entries)
	for name := range written {
		e, err := cfg.ParseEntry(name, []byte(spec))
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, e)
	}
	r := chaos.Audit(cfg.WithEntries(list), msgs, from, to)
	if !r.OK || r.ExpectedSlots < entries*3 {
		t.Fatalf("audit %s .. %s of %d slots: %d duplicate (%v), %d missed (first %v)", from.Format(time.TimeOnly), to.Format(time.TimeOnly),
			r.ExpectedSlots, len(r.Duplicates), r.Duplicates, len(r.Missed), r.Missed[:min(len(r.Missed), 5)])
	}
	t.Logf("audited %d slots across the kill: 0 duplicate, 0 missed", r.ExpectedSlots)
}
