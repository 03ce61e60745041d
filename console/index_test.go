package console

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/store"
)

// TestIndexAdvanceMatchesRebuild: as slots pass, the index re-sorts only
// the rows that fired, and the result is the order a whole rebuild gives.
func TestIndexAdvanceMatchesRebuild(t *testing.T) {
	var b []byte
	b = append(b, "entries:\n"...)
	for i := range 300 {
		switch i % 4 {
		case 0:
			b = fmt.Appendf(b, "  e%03d: {task: t, every: %ds}\n", i, 1+i%7)
		case 1:
			b = fmt.Appendf(b, "  e%03d: {task: t, crontab: {minute: '*/%d'}}\n", i, 1+i%5)
		case 2:
			b = fmt.Appendf(b, "  e%03d: {task: t, every: 1m, enabled: false}\n", i)
		default:
			b = fmt.Appendf(b, "  e%03d: {task: t, at: '2026-12-01T10:%02d:30Z'}\n", i, i%60)
		}
	}
	cfg, err := config.Parse("s.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	// Every entry was first scheduled at now (Since), as a leader that
	// runs them has stored: an interval's grid is anchored there.
	states := map[string]*store.EntryState{}
	for _, e := range cfg.Entries {
		states[e.Name] = &store.EntryState{Name: e.Name, Since: now}
	}
	s := &Server{cluster: &cluster{states: states}}
	rebuild := func(now time.Time) []indexRow {
		rows := make([]indexRow, len(cfg.Entries))
		for i, e := range cfg.Entries {
			rows[i] = newIndexRow(e, s.cluster.states[e.Name], now)
		}
		slices.SortFunc(rows, compareRows)
		return rows
	}
	rows := rebuild(now)
	for step := range 40 {
		now = now.Add(time.Duration(1300+step*97) * time.Millisecond)
		k := 0
		for k < len(rows) && rows[k].at <= now.UnixNano() {
			k++
		}
		if k == 0 {
			t.Fatalf("step %d: no slot passed in %s", step, now)
		}
		old := slices.Clone(rows)
		given := rows
		rows = s.advance(rows, k, now)
		if !slices.Equal(old, given) {
			t.Fatal("advance changed the index it was given (readers may hold it)")
		}
		want := rebuild(now)
		for i := range want {
			if rows[i].e != want[i].e || !rows[i].next.Equal(want[i].next) {
				t.Fatalf("step %d (%d moved): row %d is %s at %s, a rebuild has %s at %s", step, k, i,
					rows[i].e.Name, rows[i].next, want[i].e.Name, want[i].next)
			}
		}
	}
}
