package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/testutil"
)

func TestImport(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	s := New(cli, prefix)
	ctx := context.Background()
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	g := lead(t, cli, "a")

	// "fired" was published by beatd; "baseline" was only scheduled (a
	// Since, no publish); "fresh" has no state.
	fired := &EntryState{Name: "fired"}
	fired.Record(Run{Slot: slot, PublishedAt: slot, Token: g.Token, TaskID: "x"})
	if err := s.Save(ctx, g, []*EntryState{fired, {Name: "baseline", Since: slot.Add(time.Hour), Paused: true}}); err != nil {
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
	got, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := got["fired"]; !st.LastSlot.Equal(slot) || st.TotalRunCount != 1 {
		t.Errorf("fired was overwritten: %+v", st)
	}
	if st := got["baseline"]; !st.LastSlot.Equal(slot.Add(-2*time.Minute)) || !st.Since.IsZero() || !st.Paused {
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
