package sources

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/beatd/beatd/config"
)

// TestUpdateSourceMatchesSetSource: a run of random changes, merged entry
// by entry through UpdateSource, leaves the merger exactly where merging
// the whole source each time (SetSource) leaves it: entries, their
// sources, conflicts and invalid entries. And the scheduler is told the
// names that changed, not handed the whole config.
func TestUpdateSourceMatchesSetSource(t *testing.T) {
	t.Parallel()
	file := mustParse(t, "entries:\n  f0: {task: t.f, every: 10s}\n  f1: {task: t.f, every: 20s}\n  n3: {task: t.f, every: 30s}\n")
	var deltas, wholes int
	var lastChanged []string
	delta := New(Config{
		Apply:      func(*config.Config) error { wholes++; return nil },
		ApplyDelta: func(_ *config.Config, changed []string) error { deltas++; lastChanged = changed; return nil },
	})
	whole := New(Config{})
	docs := map[string][]byte{}
	for i := range 200 {
		docs[fmt.Sprint("n", i)] = fmt.Appendf(nil, `{"task":"t.a","every":"%ds"}`, 5+i%40)
	}
	for _, m := range []*Merger{delta, whole} {
		if err := m.SetFile(file); err != nil {
			t.Fatal(err)
		}
		if err := m.SetSource(API, clone(docs)); err != nil {
			t.Fatal(err)
		}
		if err := m.SetSource(DCB, map[string][]byte{"n7": []byte(`{"task":"t.d","every":"9s"}`), "d1": []byte(`{"task":"t.d","every":"9s"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	wholes, deltas = 0, 0
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		changes := map[string][]byte{}
		for range 1 + rng.IntN(4) {
			name := fmt.Sprint("n", rng.IntN(230)) // some new, some of the file (n3) or DCB (n7)
			switch rng.IntN(4) {
			case 0:
				changes[name] = nil
			case 1:
				changes[name] = []byte(`{"task":"t.a","every":"never"}`) // invalid
			default:
				changes[name] = fmt.Appendf(nil, `{"task":"t.b","every":"%ds"}`, 1+rng.IntN(60))
			}
		}
		for name, doc := range changes {
			if doc == nil {
				delete(docs, name)
			} else {
				docs[name] = doc
			}
		}
		if err := delta.UpdateSource(API, changes); err != nil {
			t.Fatal(err)
		}
		if err := whole.SetSource(API, clone(docs)); err != nil {
			t.Fatal(err)
		}
		if err := sameMerge(delta, whole); err != nil {
			t.Fatalf("round %d, changes %v: %v", round, slices.Sorted(mapsKeys(changes)), err)
		}
		if !slices.Equal(lastChanged, slices.Sorted(mapsKeys(changes))) {
			t.Fatalf("round %d: told the scheduler %v, want %v", round, lastChanged, slices.Sorted(mapsKeys(changes)))
		}
	}
	if wholes != 0 || deltas != 300 {
		t.Errorf("applies: %d whole, %d by delta; want every one by delta", wholes, deltas)
	}
	// A change of most entries is merged whole: cheaper than one by one.
	big := map[string][]byte{}
	for i := range 150 {
		big[fmt.Sprint("n", i)] = []byte(`{"task":"t.c","every":"7s"}`)
	}
	if err := delta.UpdateSource(API, big); err != nil {
		t.Fatal(err)
	}
	if wholes != 1 {
		t.Errorf("a change of most entries: %d whole applies, want 1", wholes)
	}
}

func clone(m map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func mapsKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func sameMerge(a, b *Merger) error {
	type row struct {
		Name, Source string
		FP           [16]byte
	}
	rows := func(m *Merger) []row {
		var out []row
		for _, e := range m.Current().Entries {
			out = append(out, row{e.Name, e.Source, e.Fingerprint})
		}
		return out
	}
	if ra, rb := rows(a), rows(b); !reflect.DeepEqual(ra, rb) {
		return fmt.Errorf("entries differ: %d by delta vs %d whole", len(ra), len(rb))
	}
	if ca, cb := a.Conflicts(), b.Conflicts(); !reflect.DeepEqual(ca, cb) {
		return fmt.Errorf("conflicts differ: %v vs %v", ca, cb)
	}
	counts := func(m *Merger) map[string]int {
		out := map[string]int{}
		for k, v := range m.perSource {
			if v != 0 {
				out[k] = v
			}
		}
		return out
	}
	if pa, pb := counts(a), counts(b); !reflect.DeepEqual(pa, pb) {
		return fmt.Errorf("entries per source differ: %v vs %v", pa, pb)
	}
	if ha, hb := a.Health(), b.Health(); !reflect.DeepEqual(ha, hb) {
		return fmt.Errorf("health differs:\n%+v\n%+v", ha, hb)
	}
	return nil
}

// TestSetSourceParsesInParallel: a source of many documents (a leader's
// start) is parsed on every core, with the result and the errors of one
// parse at a time.
func TestSetSourceParsesInParallel(t *testing.T) {
	t.Parallel()
	docs := map[string][]byte{}
	for i := range parallelFrom + 100 {
		switch {
		case i%1000 == 7:
			docs[fmt.Sprint("e", i)] = []byte(`{"task":"t","every":"never"}`)
		default:
			docs[fmt.Sprint("e", i)] = fmt.Appendf(nil, `{"task":"t.%d","crontab":{"minute":"%d"},"timezone":"Asia/Tokyo"}`, i%7, i%60)
		}
	}
	m := New(Config{})
	if err := m.SetSource(API, docs); err != nil {
		t.Fatal(err)
	}
	cur := m.Current()
	bad := (parallelFrom + 100 + 999 - 7) / 1000
	if len(cur.Entries) != len(docs)-bad {
		t.Fatalf("%d entries of %d documents (%d invalid)", len(cur.Entries), len(docs), bad)
	}
	for _, e := range cur.Entries {
		want, err := (*config.Config)(nil).ParseEntry(e.Name, docs[e.Name])
		if err != nil || want.Fingerprint != e.Fingerprint || e.Source != API {
			t.Fatalf("%s: parsed in parallel differs from alone (%v)", e.Name, err)
		}
	}
	if h := m.Health(); len(h) != 1 || len(h[0].Invalid) != bad {
		t.Fatalf("health %+v, want %d invalid", h, bad)
	}
}

// TestFailedDeltaLeavesTheRows: when the scheduler refuses a merge
// entry by entry, the source's rows and invalid entries are as they were
// before it, for names that had a row, names that were invalid, names
// that are new, and deletes.
func TestFailedDeltaLeavesTheRows(t *testing.T) {
	t.Parallel()
	refuse := false
	m := New(Config{ApplyDelta: func(*config.Config, []string) error {
		if refuse {
			return fmt.Errorf("refused")
		}
		return nil
	}})
	if err := m.SetFile(nil); err != nil {
		t.Fatal(err)
	}
	if err := m.SetSource(API, map[string][]byte{
		"a": []byte(`{"task":"t.a","every":"10s"}`), "b": []byte(`{"task":"t.b","every":"10s"}`),
		"bad": []byte(`{"task":"t.a","every":"never"}`)}); err != nil {
		t.Fatal(err)
	}
	rows, invalid := maps.Clone(m.rows[API]), maps.Clone(m.invalid[API])
	refuse = true
	err := m.UpdateSource(API, map[string][]byte{
		"a": []byte(`{"task":"t.a","every":"20s"}`), "b": nil, "bad": []byte(`{"task":"t.a","every":"5s"}`),
		"new": []byte(`{"task":"t.n","every":"5s"}`), "gone": nil, "worse": []byte(`{"task":"t.a","every":"no"}`)})
	if err == nil {
		t.Fatal("the refused merge reported no error")
	}
	if !reflect.DeepEqual(m.rows[API], rows) {
		t.Errorf("rows after a refused merge: %v, want %v", slices.Sorted(maps.Keys(m.rows[API])), slices.Sorted(maps.Keys(rows)))
	}
	if !reflect.DeepEqual(m.invalid[API], invalid) {
		t.Errorf("invalid after a refused merge: %v, want %v", m.invalid[API], invalid)
	}
}
