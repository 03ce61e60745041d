package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/store"
)

// runtimeConfig is a config of the runtime entries docs (name: document,
// as the entries API stores them), parsed as a leader parses them.
func runtimeConfig(t *testing.T, docs map[string]string) *config.Config {
	t.Helper()
	var list []*config.Entry
	for name, doc := range docs {
		e, err := (*config.Config)(nil).ParseEntry(name, []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, e)
	}
	return (*config.Config)(nil).WithEntries(list)
}

// An entry with no baseline owes its slots from when its definition was
// written (defined_at, rounded up to its second's end), caught up by its
// policy: a leader that stopped or was killed before it stored the
// baseline, or before it saw the entry, costs a late slot, not a missed
// one. Never from before the definition was written (nor from a
// defined_at ahead of the leader's clock), never in place of a baseline
// the entry has, and an entry without defined_at owes from the term's
// start as before.
func TestNoBaselineOwesFromDefinedAt(t *testing.T) {
	start := t0.Add(40 * time.Second) // 10:00:40
	doc := func(definedAt, catchup string) string {
		at := ""
		if definedAt != "" {
			at = fmt.Sprintf(`"defined_at": "2026-11-30T%sZ", `, definedAt)
		}
		return fmt.Sprintf(`{%s"task": "t", "every": "10s", "catchup": %q}`, at, catchup)
	}
	for _, tc := range []struct {
		name    string
		doc     string
		state   *store.EntryState
		advance time.Duration // after the term's start, before the check
		want    []string      // the slots published by then
	}{
		// Anchored at 10:00:12 (its second), owing from 10:00:12.999...:
		// 10:00:22 and 10:00:32 caught up at once, then 10:00:42.
		{"no state: owed since written", doc("10:00:12.300", "all"), nil, 2 * time.Second,
			[]string{"10:00:22", "10:00:32", "10:00:42"}},
		{"no state, catchup once", doc("10:00:12.300", "once"), nil, 2 * time.Second,
			[]string{"10:00:32", "10:00:42"}},
		// A slot in the second of the write (10:00:20 here) may be before
		// the write itself: never owed.
		{"no slot of the write's second", doc("10:00:20.000", "all"), nil, 10 * time.Second,
			[]string{"10:00:30", "10:00:40", "10:00:50"}},
		// A defined_at ahead of the leader's clock owes from now.
		{"written after now", doc("10:00:45.000", "all"), nil, 10 * time.Second,
			[]string{"10:00:50"}},
		{"no defined_at: owed from the start", doc("", "all"), nil, 10 * time.Second,
			[]string{"10:00:50"}},
		// A baseline it has wins: a later defined_at (the same definition
		// written again) owes nothing less.
		{"baseline before defined_at", doc("10:00:30.000", "all"),
			&store.EntryState{Name: "e", Since: t0.Add(5 * time.Second)}, 0,
			[]string{"10:00:15", "10:00:25", "10:00:35"}},
		{"last slot before defined_at", doc("10:00:30.000", "all"),
			&store.EntryState{Name: "e", LastSlot: t0.Add(15 * time.Second)}, 0,
			[]string{"10:00:25", "10:00:35"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "entries: {}\n", start)
			if err := h.sched.Reload(runtimeConfig(t, map[string]string{"e": tc.doc})); err != nil {
				t.Fatal(err)
			}
			if tc.state != nil {
				h.store.states["e"] = tc.state
			}
			h.start(7)
			h.settle()
			if tc.advance > 0 {
				h.clock.Advance(tc.advance)
				h.settle()
			}
			got := h.waitPublished(len(tc.want))
			want := slots("e", slices.Collect(func(yield func(string) bool) {
				for _, s := range tc.want {
					if !yield("2026-11-30T" + s + "Z") {
						return
					}
				}
			})...)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("published %v, want %v", got, want)
			}
		})
	}
}

// A running leader that takes in a new runtime entry late (a watch that
// lags the writes) owes it the slots since its definition was written,
// and stores that baseline.
func TestReloadedEntryOwesFromDefinedAt(t *testing.T) {
	h := newHarness(t, "entries: {}\n", t0.Add(40*time.Second))
	h.start(7)
	h.settle()
	if err := h.sched.Reload(runtimeConfig(t, map[string]string{
		"e": `{"defined_at": "2026-11-30T10:00:37.500Z", "task": "t", "every": "1s", "catchup": "all"}`,
	})); err != nil {
		t.Fatal(err)
	}
	h.settle()
	got := h.waitPublished(3)
	if want := slots("e", "2026-11-30T10:00:38Z", "2026-11-30T10:00:39Z", "2026-11-30T10:00:40Z"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("published %v, want %v", got, want)
	}
	eventually(t, 5*time.Second, "the baseline stored", func() bool {
		h.store.mu.Lock()
		defer h.store.mu.Unlock()
		st := h.store.states["e"]
		return st != nil && st.Since.Equal(time.Date(2026, 11, 30, 10, 0, 37, 999999999, time.UTC))
	})
}

// A file's or dcb's entry has no defined_at: with no baseline it owes its
// slots from when this replica first saw it (Config.FirstSeen, for an
// entry its source gained while the replica ran), caught up by its
// policy; from the term's start when that is unknown or ahead of the
// clock. A runtime entry's defined_at comes first.
func TestNoBaselineOwesFromFirstSeen(t *testing.T) {
	start := t0.Add(40 * time.Second) // 10:00:40
	for _, tc := range []struct {
		name      string
		yaml      string
		firstSeen time.Time
		want      []string // the slots published by 10:00:50
	}{
		// Its grid anchored at the second it was first seen, as a
		// runtime entry's at its defined_at.
		{"seen at 10:00:12.3", "entries:\n  e: {task: t, every: 10s, catchup: all}\n", t0.Add(12300 * time.Millisecond),
			[]string{"10:00:22", "10:00:32", "10:00:42"}},
		{"seen at 10:00:12.3, catchup once", "entries:\n  e: {task: t, every: 10s, catchup: once}\n", t0.Add(12300 * time.Millisecond),
			[]string{"10:00:32", "10:00:42"}},
		{"not seen: owed from the start", "entries:\n  e: {task: t, every: 10s, catchup: all}\n", time.Time{},
			[]string{"10:00:50"}},
		{"seen after now: owed from the start", "entries:\n  e: {task: t, every: 10s, catchup: all}\n", t0.Add(45 * time.Second),
			[]string{"10:00:50"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.yaml, start)
			h.sched.cfg.FirstSeen = func(name string) time.Time {
				if name == "e" {
					return tc.firstSeen
				}
				return time.Time{}
			}
			h.start(7)
			h.settle()
			h.clock.Advance(10 * time.Second)
			h.settle()
			got := h.waitPublished(len(tc.want))
			var want []string
			for _, s := range tc.want {
				want = append(want, "2026-11-30T"+s+"Z")
			}
			if w := slots("e", want...); strings.Join(got, ",") != strings.Join(w, ",") {
				t.Fatalf("published %v, want %v", got, w)
			}
		})
	}
	// defined_at first.
	h := newHarness(t, "entries: {}\n", start)
	h.sched.cfg.FirstSeen = func(string) time.Time { return t0.Add(2 * time.Second) } // 10:00:02
	if err := h.sched.Reload(runtimeConfig(t, map[string]string{"e": `{"defined_at": "2026-11-30T10:00:12.300Z", "task": "t", "every": "10s", "catchup": "all"}`})); err != nil {
		t.Fatal(err)
	}
	h.start(7)
	h.settle()
	h.clock.Advance(2 * time.Second)
	h.settle()
	if got, want := h.waitPublished(3), slots("e", "2026-11-30T10:00:22Z", "2026-11-30T10:00:32Z", "2026-11-30T10:00:42Z"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("defined_at and FirstSeen: published %v, want %v", got, want)
	}
}
