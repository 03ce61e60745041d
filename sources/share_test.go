package sources

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
)

// shardedMerger is a merger over n shards (keys.ShardOf), as a sharded
// replica's, and the last config it applied.
func shardedMerger(t testing.TB, n int) (*Merger, func() *config.Config) {
	var applied *config.Config
	m := New(Config{Apply: func(c *config.Config) error { applied = c; return nil },
		ShardOf: func(name string) int { return keys.ShardOf(name, n) }})
	return m, func() *config.Config { return applied }
}

// inShard is the names of names in shard i of n.
func inShard(names []string, i, n int) []string {
	return slices.DeleteFunc(slices.Clone(names), func(s string) bool { return keys.ShardOf(s, n) != i })
}

func entryNames(c *config.Config) []string {
	var out []string
	for _, e := range c.Entries {
		out = append(out, e.Name)
	}
	return out
}

// TestShardPartHolds checks that a sharded merger holds the file's and
// django-celery-beat's entries of the shards a part holds alone, through
// loads, reloads, polls and drops, while its index keeps every name for
// FileHas, Unheld and the conflicts.
func TestShardPartHolds(t *testing.T) {
	t.Parallel()
	const n = 4
	var yaml strings.Builder
	yaml.WriteString("entries:\n")
	var fileNames, dcbNames []string
	docs := map[string][]byte{}
	for i := range 24 {
		name := fmt.Sprintf("f%02d", i)
		fileNames = append(fileNames, name)
		fmt.Fprintf(&yaml, "  %s: {task: t.file, every: 10s}\n", name)
		name = fmt.Sprintf("d%02d", i)
		dcbNames = append(dcbNames, name)
		docs[name] = []byte(`{"task":"t.dcb","every":"10s"}`)
	}
	// Names in both: the file wins them by the default priority.
	for i := range 8 {
		name := fmt.Sprintf("both%d", i)
		fileNames, dcbNames = append(fileNames, name), append(dcbNames, name)
		fmt.Fprintf(&yaml, "  %s: {task: t.file, every: 10s}\n", name)
		docs[name] = []byte(`{"task":"t.dcb","every":"10s"}`)
	}
	data := []byte(yaml.String())
	whole, err := config.Check("s.yaml", data, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, applied := shardedMerger(t, n)
	if err := m.SetFile(whole); err != nil {
		t.Fatal(err)
	}
	if err := m.SetSourceRows(DCB, docs, nil); err != nil {
		t.Fatal(err)
	}
	all := slices.Sorted(slices.Values(slices.Concat(fileNames, dcbNames)))
	all = slices.Compact(all)
	wantConflicts := func() []string {
		var out []string
		for i := range 8 {
			out = append(out, fmt.Sprintf("both%d", i))
		}
		return out
	}()
	conflicts := func() []string {
		var out []string
		for _, c := range m.Conflicts() {
			if c.Winner != File || strings.Join(c.Sources, ",") != "file,django-celery-beat" {
				t.Errorf("conflict %+v", c)
			}
			out = append(out, c.Name)
		}
		return out
	}
	// Nothing held: no entry, every name indexed.
	if got := applied().Entries; len(got) != 0 {
		t.Fatalf("holding no shard, the merge has %d entries", len(got))
	}
	for _, name := range fileNames {
		if !m.FileHas(name) {
			t.Errorf("FileHas(%s) false", name)
		}
	}
	if m.FileHas("d00") {
		t.Error("FileHas(d00), a dcb name")
	}
	if got := conflicts(); !slices.Equal(got, wantConflicts) {
		t.Errorf("conflicts %v, want %v", got, wantConflicts)
	}
	for _, h := range m.Health() {
		if want := map[string]int{File: len(fileNames), DCB: len(dcbNames)}[h.Source]; h.Entries != want {
			t.Errorf("health of %s: %d entries, want %d", h.Source, h.Entries, want)
		}
	}
	var paged []string
	for after := ""; ; {
		page, total := m.Unheld(after, "", 5)
		if total != len(all)-len(paged) {
			t.Errorf("Unheld after %q: %d follow, want %d", after, total, len(all)-len(paged))
		}
		for _, u := range page {
			paged = append(paged, u.Name)
			if want := map[bool]string{true: File, false: DCB}[strings.HasPrefix(u.Name, "f") || strings.HasPrefix(u.Name, "both")]; u.Source != want {
				t.Errorf("Unheld %s from %s, want %s", u.Name, u.Source, want)
			}
		}
		if len(page) < 5 {
			break
		}
		after = page[len(page)-1].Name
	}
	if !slices.Equal(paged, all) {
		t.Errorf("Unheld pages %v, want %v", paged, all)
	}
	if page, total := m.Unheld("", "both", 100); len(page) != 8 || total != 8 {
		t.Errorf("Unheld with prefix both: %v, %d", page, total)
	}

	// Shard 1 held: its entries of both sources, loaded as a term does.
	load := func(i int) {
		t.Helper()
		p := m.ShardPart(i)
		p.Hold()
		part, err := config.CheckPart("s.yaml", data, config.Options{}, p.Has)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.SetFile(part); err != nil {
			t.Fatal(err)
		}
		mine := map[string][]byte{}
		for name, d := range docs {
			if p.Has(name) {
				mine[name] = d
			}
		}
		if err := p.SetSource(DCB, mine); err != nil {
			t.Fatal(err)
		}
	}
	load(1)
	want := inShard(all, 1, n)
	if got := entryNames(applied()); !slices.Equal(got, want) {
		t.Fatalf("holding shard 1: %v, want %v", got, want)
	}
	for _, e := range applied().Entries {
		if wantSrc := map[bool]string{true: DCB, false: File}[strings.HasPrefix(e.Name, "d")]; e.Source != wantSrc {
			t.Errorf("%s from %s, want %s", e.Name, e.Source, wantSrc)
		}
	}
	if got := conflicts(); !slices.Equal(got, wantConflicts) {
		t.Errorf("holding shard 1, conflicts %v, want %v", got, wantConflicts)
	}
	if page, total := m.Unheld("", "", 1000); total != len(all)-len(want) || slices.ContainsFunc(page, func(u Named) bool { return keys.ShardOf(u.Name, n) == 1 }) {
		t.Errorf("Unheld while holding shard 1: %d, %v", total, page)
	}

	// A poll changes a document of shard 1 and one of another shard, and
	// adds a name: shard 1's change is applied, the other indexed only.
	other := inShard(dcbNames, 2, n)[0]
	held := inShard(slices.DeleteFunc(slices.Clone(dcbNames), func(s string) bool { return strings.HasPrefix(s, "both") }), 1, n)[0]
	polled := maps.Clone(docs)
	polled[held] = []byte(`{"task":"t.changed","every":"10s"}`)
	polled[other] = []byte(`{"task":"t.changed","every":"10s"}`)
	polled["new-dcb"] = []byte(`{"task":"t.dcb","every":"10s"}`)
	if err := m.SetSourceRows(DCB, polled, nil); err != nil {
		t.Fatal(err)
	}
	if e := applied().Entry(held); e == nil || e.Task != "t.changed" {
		t.Errorf("the held entry %s after the poll: %+v", held, e)
	}
	if applied().Entry(other) != nil {
		t.Errorf("the poll made shard 2's %s held", other)
	}
	if got := m.Indexed("new-dcb"); !slices.Equal(got, []string{DCB}) {
		t.Errorf("Indexed(new-dcb) = %v", got)
	}
	if held := len(m.rows[DCB]); held != len(inShard(slices.Collect(maps.Keys(polled)), 1, n)) {
		t.Errorf("%d dcb rows held, want shard 1's %d", held, len(inShard(slices.Collect(maps.Keys(polled)), 1, n)))
	}

	// A reload: the held shard's entries follow it, the index too.
	reloaded, err := config.Check("s.yaml", append(slices.Clone(data), "  f-new: {task: t.file, every: 10s}\n"...), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetFile(reloaded); err != nil {
		t.Fatal(err)
	}
	if !m.FileHas("f-new") {
		t.Error("a reload's new name not indexed")
	}
	if got, want := applied().Entry("f-new") != nil, keys.ShardOf("f-new", n) == 1; got != want {
		t.Errorf("f-new held %v, want %v", got, want)
	}

	// Dropped: nothing held, every name still indexed.
	if err := m.ShardPart(1).Drop(); err != nil {
		t.Fatal(err)
	}
	if got := applied().Entries; len(got) != 0 {
		t.Errorf("after the drop %d entries held: %v", len(got), entryNames(applied()))
	}
	if len(m.rows[DCB]) != 0 || len(m.File().Entries) != 0 {
		t.Errorf("after the drop: %d dcb rows, %d file entries", len(m.rows[DCB]), len(m.File().Entries))
	}
	if got := conflicts(); !slices.Equal(got, wantConflicts) {
		t.Errorf("after the drop, conflicts %v, want %v", got, wantConflicts)
	}
}

// TestShardShareMemory measures what a merger holds of 40,000 file and
// 40,000 django-celery-beat entries: unsharded (every replica's before
// the file and dcb followed the share), and sharded at 4 holding one
// shard. The sharded one holds that shard's parsed entries alone, and
// about a quarter of the heap.
func TestShardShareMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("parses 80,000 entries twice")
	}
	const (
		entries = 40000
		n       = 4
	)
	var yaml strings.Builder
	yaml.WriteString("entries:\n")
	docs := map[string][]byte{}
	for i := range entries {
		fmt.Fprintf(&yaml, "  file-%05d: {task: app.tasks.file, every: %ds, args: [%d], options: {queue: q%d}}\n", i, 10+i%50, i, i%7)
		docs[fmt.Sprintf("dcb-%05d", i)] = fmt.Appendf(nil, `{"task":"app.tasks.dcb","every":"%ds","enabled":true,"args":[%d],"options":{"queue":"q%d"}}`, 10+i%50, i, i%7)
	}
	data := []byte(yaml.String())
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	measure := func(sharded bool) (int, uint64) {
		base := heap()
		var m *Merger
		var applied func() *config.Config
		if sharded {
			m, applied = shardedMerger(t, n)
		} else {
			var cur *config.Config
			m = New(Config{Apply: func(c *config.Config) error { cur = c; return nil }})
			applied = func() *config.Config { return cur }
		}
		file, err := config.Check("s.yaml", data, config.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetFile(file); err != nil {
			t.Fatal(err)
		}
		file = nil
		if err := m.SetSourceRows(DCB, maps.Clone(docs), nil); err != nil {
			t.Fatal(err)
		}
		if sharded {
			p := m.ShardPart(0)
			p.Hold()
			part, err := config.CheckPart("s.yaml", data, config.Options{}, p.Has)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.SetFile(part); err != nil {
				t.Fatal(err)
			}
			mine := map[string][]byte{}
			for name, d := range docs {
				if p.Has(name) {
					mine[name] = d
				}
			}
			if err := p.SetSource(DCB, mine); err != nil {
				t.Fatal(err)
			}
		}
		held := len(applied().Entries)
		used := heap() - base
		// The inputs stay live to here, or the base would count them
		// and the end not.
		runtime.KeepAlive(m)
		runtime.KeepAlive(docs)
		runtime.KeepAlive(data)
		return held, used
	}
	wholeN, wholeHeap := measure(false)
	shareN, shareHeap := measure(true)
	t.Logf("40,000 file + 40,000 dcb entries: unsharded merger holds %d entries, %.1f MiB; sharded at %d holding 1 shard: %d entries, %.1f MiB (%.0f%%); the file's bytes a sharded replica keeps: %.1f MiB",
		wholeN, float64(wholeHeap)/(1<<20), n, shareN, float64(shareHeap)/(1<<20), 100*float64(shareHeap)/float64(wholeHeap), float64(len(data))/(1<<20))
	if wholeN != 2*entries {
		t.Errorf("unsharded: %d entries held, want %d", wholeN, 2*entries)
	}
	if lo, hi := 2*entries/n*8/10, 2*entries/n*12/10; shareN < lo || shareN > hi {
		t.Errorf("sharded, holding 1 of %d shards: %d entries held, want ~%d", n, shareN, 2*entries/n)
	}
	if shareHeap*100 > wholeHeap*40 {
		t.Errorf("sharded, holding 1 of %d shards: %d bytes held, over 40%% of unsharded %d", n, shareHeap, wholeHeap)
	}
}

// TestShardPartDelta: a part's load and drop merge only the part's names
// (ApplyDelta), however many, and give what a whole merge gives: the
// entries and their sources, the conflicts and every source's health.
// At 900,000 entries over 16 shards each load went through a whole
// merge (a shard's ~56,000 names are past deltaMost), copying and
// merging every shard the replica held again.
func TestShardPartDelta(t *testing.T) {
	t.Parallel()
	const n = 4
	var yaml strings.Builder
	yaml.WriteString("entries:\n")
	dcb, api := map[string][]byte{}, map[string][]byte{}
	for i := range 40 {
		fmt.Fprintf(&yaml, "  f%02d: {task: t.file, every: 10s}\n", i)
		dcb[fmt.Sprintf("d%02d", i)] = []byte(`{"task":"t.dcb","every":"10s"}`)
		api[fmt.Sprintf("a%02d", i)] = []byte(`{"task":"t.api","every":"10s"}`)
	}
	for i := range 8 { // in the file and dcb: a conflict the file wins
		fmt.Fprintf(&yaml, "  both%d: {task: t.file, every: 10s}\n", i)
		dcb[fmt.Sprintf("both%d", i)] = []byte(`{"task":"t.dcb","every":"10s"}`)
	}
	for i := range 4 { // invalid in each source's shards
		dcb[fmt.Sprintf("bad-d%d", i)] = []byte(`{"task":"t.dcb","every":"nope"}`)
		api[fmt.Sprintf("bad-a%d", i)] = []byte(`{"task":"t.api","every":"nope"}`)
	}
	data := []byte(yaml.String())
	whole, err := config.Check("s.yaml", data, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	type merger struct {
		m       *Merger
		applied *config.Config
		deltas  [][]string
		wholes  int
	}
	mk := func(delta bool) *merger {
		mm := &merger{}
		c := Config{Apply: func(c *config.Config) error { mm.applied = c; mm.wholes++; return nil },
			ShardOf: func(name string) int { return keys.ShardOf(name, n) }}
		if delta {
			c.ApplyDelta = func(c *config.Config, names []string) error {
				mm.applied = c
				mm.deltas = append(mm.deltas, slices.Clone(names))
				return nil
			}
		}
		mm.m = New(c)
		if err := mm.m.SetFile(whole); err != nil {
			t.Fatal(err)
		}
		if err := mm.m.SetSourceRows(DCB, dcb, nil); err != nil {
			t.Fatal(err)
		}
		return mm
	}
	part := func(docs map[string][]byte, p *Part) map[string][]byte {
		out := map[string][]byte{}
		for name, d := range docs {
			if p.Has(name) {
				out[name] = d
			}
		}
		return out
	}
	load := func(mm *merger, i int) {
		t.Helper()
		p := mm.m.ShardPart(i)
		p.Hold()
		fp, err := config.CheckPart("s.yaml", data, config.Options{}, p.Has)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.SetFile(fp); err != nil {
			t.Fatal(err)
		}
		if err := p.SetSource(DCB, part(dcb, p)); err != nil {
			t.Fatal(err)
		}
		if err := p.SetSource(API, part(api, p)); err != nil {
			t.Fatal(err)
		}
	}
	type view struct {
		Entries   []string
		Conflicts []string
		Health    []Health
	}
	see := func(mm *merger) view {
		var v view
		for _, e := range mm.applied.Entries {
			v.Entries = append(v.Entries, e.Name+"@"+e.Source+"/"+e.Task)
		}
		for _, c := range mm.m.Conflicts() {
			v.Conflicts = append(v.Conflicts, c.Name+":"+strings.Join(c.Sources, ","))
		}
		slices.Sort(v.Conflicts)
		v.Health = mm.m.Health()
		return v
	}
	d, w := mk(true), mk(false)
	for _, step := range []struct {
		name string
		do   func(*merger)
	}{
		{"load shard 1", func(mm *merger) { load(mm, 1) }},
		{"load shard 3", func(mm *merger) { load(mm, 3) }},
		{"drop shard 1", func(mm *merger) {
			if err := mm.m.ShardPart(1).Drop(); err != nil {
				t.Fatal(err)
			}
		}},
		{"load shard 0", func(mm *merger) { load(mm, 0) }},
		{"drop shard 3", func(mm *merger) {
			if err := mm.m.ShardPart(3).Drop(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		wholesBefore, deltasBefore := d.wholes, len(d.deltas)
		step.do(d)
		step.do(w)
		if got, want := see(d), see(w); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: entry by entry\n%+v\nwhole\n%+v", step.name, got, want)
		}
		if d.wholes != wholesBefore {
			t.Errorf("%s: merged whole %d times", step.name, d.wholes-wholesBefore)
		}
		if len(d.deltas) == deltasBefore {
			t.Errorf("%s: nothing merged entry by entry", step.name)
		}
		var shard int
		fmt.Sscanf(step.name[len(step.name)-1:], "%d", &shard)
		for _, names := range d.deltas[deltasBefore:] {
			for _, name := range names {
				if keys.ShardOf(name, n) != shard {
					t.Errorf("%s: merged %s, of shard %d", step.name, name, keys.ShardOf(name, n))
				}
			}
		}
	}
	if len(see(d).Entries) == 0 {
		t.Fatal("nothing held at the end: the test checks nothing")
	}
}

// TestPartParseHoldsNoLock checks that a shard's load parses its
// documents holding none of the merger's locks: a change to another
// shard's runtime entries (a DELETE through the API, applied by its
// watch) goes through while the parse runs, and the load still applies
// every document it parsed.
func TestPartParseHoldsNoLock(t *testing.T) {
	t.Parallel()
	const n = 4
	var applied *config.Config
	var m *Merger
	updated := make(chan error, 1)
	other := ""
	for i := 0; other == "" || keys.ShardOf(other, n) == 0; i++ {
		other = fmt.Sprintf("other-%d", i)
	}
	m = New(Config{Apply: func(c *config.Config) error { applied = c; return nil },
		ShardOf: func(name string) int { return keys.ShardOf(name, n) },
		Background: func(parse func()) {
			go func() {
				updated <- m.UpdateSource(API, map[string][]byte{other: []byte(`{"task":"t.other","every":"10s"}`)})
			}()
			select {
			case err := <-updated:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(10 * time.Second):
				t.Error("another shard's update waited for a load's parse")
			}
			parse()
		}})
	if err := m.SetFile(&config.Config{}); err != nil {
		t.Fatal(err)
	}
	docs := map[string][]byte{}
	var want []string
	for i := 0; len(want) < 50; i++ {
		name := fmt.Sprintf("e%03d", i)
		if keys.ShardOf(name, n) == 0 {
			docs[name] = []byte(`{"task":"t.e","every":"10s"}`)
			want = append(want, name)
		}
	}
	if err := m.ShardPart(0).SetSource(API, docs); err != nil {
		t.Fatal(err)
	}
	got := entryNames(applied)
	if !slices.Contains(got, other) {
		t.Errorf("the other shard's entry %s is not applied: %v", other, got)
	}
	for _, name := range want {
		if !slices.Contains(got, name) {
			t.Errorf("entry %s of the load is not applied", name)
		}
	}
}
