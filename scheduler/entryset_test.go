package scheduler

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/beatd/beatd/config"
)

// TestEntrySetWithChanges checks a delta set against the set it stands
// for: sc's entries in order, the named ones compiled anew from sc, every
// other one the running entry itself (its schedule and counters go on).
func TestEntrySetWithChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	base := map[string]string{}
	for i := range 300 {
		base[fmt.Sprintf("e%03d", i*2)] = "every: 1m"
	}
	yamlOf := func(m map[string]string) *config.Config {
		var b strings.Builder
		b.WriteString("entries:\n")
		for _, name := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(&b, "  %s: {task: t, %s}\n", name, m[name])
		}
		return mustConfig(t, b.String())
	}
	cur, err := newEntrySet(yamlOf(base))
	if err != nil {
		t.Fatal(err)
	}
	for round := range 50 {
		next := maps.Clone(base)
		var changed []string
		for range 1 + r.IntN(20) {
			name := fmt.Sprintf("e%03d", r.IntN(620))
			switch _, has := next[name]; {
			case has && r.IntN(2) == 0:
				delete(next, name)
			default:
				next[name] = fmt.Sprintf("every: %dm", 1+r.IntN(60))
			}
			changed = append(changed, name, name) // a name twice is one change
		}
		sc := yamlOf(next)
		// sc is parsed anew: the caller's word is that only the named
		// entries differ, so the others keep the running definitions.
		set, ok, err := cur.withChanges(sc, changed)
		if err != nil || !ok {
			t.Fatalf("round %d: ok %v, err %v", round, ok, err)
		}
		if len(set.list) != len(sc.Entries) {
			t.Fatalf("round %d: %d entries, want %d", round, len(set.list), len(sc.Entries))
		}
		for i, e := range set.list {
			if e.Name != sc.Entries[i].Name {
				t.Fatalf("round %d: entry %d is %s, want %s", round, i, e.Name, sc.Entries[i].Name)
			}
			if slices.Contains(changed, e.Name) {
				if e.Entry != sc.Entries[i] || e == cur.get(e.Name) {
					t.Fatalf("round %d: changed %s was not compiled from the new config", round, e.Name)
				}
			} else if e != cur.get(e.Name) {
				t.Fatalf("round %d: unchanged %s lost its running entry", round, e.Name)
			}
			if set.get(e.Name) != e {
				t.Fatalf("round %d: get(%s) does not find it", round, e.Name)
			}
		}
		if set.get("zzz") != nil || set.get("e") != nil {
			t.Fatalf("round %d: get finds a name not in the set", round)
		}
		cur, base = set, next
	}

	// A config with an entry the changes do not account for is
	// compiled whole, and said so.
	extra := maps.Clone(base)
	extra["unnamed"] = "every: 1m"
	set, ok, err := cur.withChanges(yamlOf(extra), nil)
	if err != nil || ok || set.get("unnamed") == nil {
		t.Errorf("an unaccounted entry: ok %v, err %v, found %v", ok, err, set.get("unnamed") != nil)
	}
}
