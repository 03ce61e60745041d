package store

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestImport(t *testing.T) {
	cli := newClient(t)
	pfx := testPrefix(t)
	s := New(cli, pfx)
	ctx := context.Background()
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	g := lead(t, cli, pfx)

	// "fired" was published by beatd; "baseline" was only scheduled (a
	// Since, no publish); "fresh" has no state.
	tab := NewTable()
	tab.Set(EntryState{Name: "fired", LastSlot: slot})
	tab.Set(EntryState{Name: "baseline", Since: slot.Add(time.Hour), Paused: true})
	if err := s.Save(ctx, g, tab, nil); err != nil {
		t.Fatal(err)
	}
	in := []ImportedState{
		{Name: "fired", LastSlot: slot.Add(-time.Minute)},
		{Name: "baseline", LastSlot: slot.Add(-2 * time.Minute)},
		{Name: "fresh", LastSlot: slot.Add(-3 * time.Minute)},
	}
	refused, err := s.Import(ctx, in, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(refused, []string{"fired"}) {
		t.Fatalf("refused %v, want [fired]", refused)
	}
	loaded, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := loaded.States()
	if st := got["fired"]; !st.LastSlot.Equal(slot) || st.Imported {
		t.Errorf("fired was overwritten: %+v", st)
	}
	if st := got["baseline"]; !st.LastSlot.Equal(slot.Add(-2*time.Minute)) || !st.Since.IsZero() || !st.Paused || !st.Imported {
		t.Errorf("baseline = %+v, want the imported slot, no Since, still paused", st)
	}
	if st := got["fresh"]; !st.LastSlot.Equal(slot.Add(-3*time.Minute)) || st.CatchupFrom() != st.LastSlot {
		t.Errorf("fresh = %+v", st)
	}
	// Importing again is allowed until beatd publishes; --force overwrites.
	if refused, err := s.Import(ctx, in[1:], false); err != nil || len(refused) != 0 {
		t.Fatalf("re-import: refused %v, %v", refused, err)
	}
	if refused, err := s.Import(ctx, in[:1], true); err != nil || len(refused) != 0 {
		t.Fatalf("forced import: refused %v, %v", refused, err)
	}
	if st, _ := s.Get(ctx, "fired"); !st.LastSlot.Equal(slot.Add(-time.Minute)) {
		t.Errorf("forced import kept %s", st.LastSlot)
	}
}
