package sources

import (
	"time"
)

// A file's or django-celery-beat's entry carries no time it was defined
// (a runtime entry's defined_at), so a leader that takes over before the
// old one stored the new entry's baseline (killed, or on a pod whose
// ConfigMap had not been updated yet) would start it anew at its term,
// missing the slots between. The merger keeps, for each name a whole
// source gained while this replica ran, when it first saw it: a new
// leader owes such an entry's slots from then (scheduler.Config's
// FirstSeen). Names read at a source's first set are not new: nothing
// says when they were added, and a fresh cluster must not owe a file's
// whole past.

// noteSeen records the names a whole source gained (seen at now) and
// drops those it lost, walking prev and next, its names before and after
// the set, both sorted by name (n and at read them by index); first says
// prev is the source's first set, whose names are not new.
func (m *Merger) noteSeen(source string, first bool, prevN, nextN int, prevAt, nextAt func(int) string) {
	if first {
		return
	}
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	seen := m.seen[source]
	now := m.c.Now()
	i, j := 0, 0
	for i < prevN || j < nextN {
		switch {
		case j == nextN || i < prevN && prevAt(i) < nextAt(j):
			delete(seen, prevAt(i)) // gone
			i++
		case i == prevN || nextAt(j) < prevAt(i):
			if seen == nil {
				seen = map[string]time.Time{}
				m.seen[source] = seen
			}
			seen[nextAt(j)] = now
			j++
		default:
			i, j = i+1, j+1
		}
	}
}

// FirstSeen is when this replica first saw the entry name in the file or
// in django-celery-beat, if one of them gained it while the replica ran;
// zero otherwise.
func (m *Merger) FirstSeen(name string) time.Time {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	for _, src := range m.c.Priority {
		if t, ok := m.seen[src][name]; ok {
			return t
		}
	}
	return time.Time{}
}

// noteSeenSet is noteSeen for a source whose sets are maps (an unsharded
// replica's django-celery-beat): lookups, not a sort of each set.
func (m *Merger) noteSeenSet(source string, prev map[string]row, next map[string][]byte) {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	seen := m.seen[source]
	for name := range seen {
		if _, ok := next[name]; !ok {
			delete(seen, name)
		}
	}
	now := m.c.Now()
	for name := range next {
		if _, ok := prev[name]; !ok {
			if seen == nil {
				seen = map[string]time.Time{}
				m.seen[source] = seen
			}
			seen[name] = now
		}
	}
}
