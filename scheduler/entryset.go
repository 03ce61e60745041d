package scheduler

import (
	"fmt"
	"slices"
	"strings"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/schedule"
)

// entry is a config entry compiled for publishing.
type entry struct {
	*config.Entry
	task *celery.Task // compiled on first fire, by the loop
	// fires holds the fire counters by broker.Result, then manual,
	// made at the first fire: an entry that never fired weighs 72 bytes
	// less, which counts at 100k entries.
	fires *[6]*Counter
	// runs holds its beatd_runs_total counters by outcome, made at the
	// first run that reaches each.
	runs *[outcome.NumKinds]*Counter
	// sched is the schedule the loop runs: the entry's, with an interval
	// anchored where it began (startEntry). Loop-owned; the definition
	// itself is never changed, so other goroutines read it freely.
	sched schedule.Schedule
	// it is the entry's next slot in the loop's heap, nil when it has
	// none. Loop-owned, and set anew by each term's start: it stands for
	// a map by name, which at a million entries weighs ~60 MB.
	it *item
	// pubSeq is the number of the last publication that held one of its
	// fires (publishPending). Loop-owned.
	pubSeq uint64
}

// entrySet is the running entries, in name order as config.Entries: a
// sorted slice, not a map, because a million entries make a map of
// ~50 MB and a change would copy it; a change copies the slice instead.
type entrySet struct {
	list   []*entry
	config *config.Config
}

// get returns the entry named name, or nil.
func (s *entrySet) get(name string) *entry {
	i, ok := slices.BinarySearchFunc(s.list, name, cmpName)
	if !ok {
		return nil
	}
	return s.list[i]
}

// names returns the set's names, for a check of every state: a binary
// search at a million entries takes ~3 µs (a cache miss at each step
// down), a map made for the check ~0.3 µs a name, and it is dropped after.
func (s *entrySet) names() map[string]struct{} {
	m := make(map[string]struct{}, len(s.list))
	for _, e := range s.list {
		m[e.Name] = struct{}{}
	}
	return m
}

func cmpName(e *entry, name string) int { return strings.Compare(e.Name, name) }

// newEntrySet compiles every entry of sc.
func newEntrySet(sc *config.Config) (*entrySet, error) {
	set := &entrySet{list: make([]*entry, len(sc.Entries)), config: sc}
	for i, e := range sc.Entries {
		// Templates are compiled when a slot comes due (prepare): with
		// 100k entries, most would otherwise sit in memory long before
		// they are needed.
		if err := ValidateEntry(e); err != nil {
			return nil, err
		}
		set.list[i] = &entry{Entry: e}
	}
	if !slices.IsSortedFunc(set.list, func(a, b *entry) int { return strings.Compare(a.Name, b.Name) }) {
		return nil, fmt.Errorf("scheduler: the config's entries are not in name order")
	}
	return set, nil
}

// withChanges is s for sc, which differs from s's config only in the
// entries named: those are compiled anew, the rest keep their entry (and
// its definition, the same by the caller's word). The runs between
// changed names are copied whole. ok is false when sc has more or fewer
// entries than that makes (a caller's mistake): the set is then sc's,
// compiled whole, for the loop to apply whole.
func (s *entrySet) withChanges(sc *config.Config, changed []string) (set *entrySet, ok bool, err error) {
	names := slices.Clone(changed)
	slices.Sort(names)
	names = slices.Compact(names)
	list := make([]*entry, 0, len(sc.Entries))
	j := 0
	for _, name := range names {
		k, found := slices.BinarySearchFunc(s.list[j:], name, cmpName)
		list = append(list, s.list[j:j+k]...)
		if j += k; found {
			j++ // replaced or removed
		}
		if e := sc.Entry(name); e != nil {
			if err := ValidateEntry(e); err != nil {
				return nil, false, err
			}
			list = append(list, &entry{Entry: e})
		}
	}
	list = append(list, s.list[j:]...)
	if len(list) != len(sc.Entries) {
		set, err := newEntrySet(sc)
		return set, false, err
	}
	return &entrySet{list: list, config: sc}, true, nil
}
