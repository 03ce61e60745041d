package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestAuditBounded: records come back newest first, per entry, and the
// oldest go once there are more than AuditKeep (plus the trim's slack).
func TestAuditBounded(t *testing.T) {
	cli := newClient(t)
	s := New(cli, testPrefix(t))
	s.SetAuditKeep(100)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for i := range 300 {
		entry := "a"
		if i%3 == 0 {
			entry = "b"
		}
		if err := s.Audit(ctx, AuditRecord{At: t0.Add(time.Duration(i) * time.Second), Actor: "alice", Action: "pause", Entry: entry, Note: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.AuditLog(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(all); n < 100 || n > 100+auditSlack {
		t.Fatalf("%d records kept, want 100 to %d", n, 100+auditSlack)
	}
	if all[0].Note != "299" || !all[0].At.Equal(t0.Add(299*time.Second)) {
		t.Errorf("newest first: %+v", all[0])
	}
	b, err := s.AuditLog(ctx, "b", 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 5 || b[0].Note != "297" || b[4].Note != "285" {
		t.Errorf("entry b, 5 newest: %+v", b)
	}
	// A record of many entries concerns each.
	if err := s.Audit(ctx, AuditRecord{At: t0.Add(time.Hour), Action: "put", Entries: []string{"x", "y"}}); err != nil {
		t.Fatal(err)
	}
	if y, _ := s.AuditLog(ctx, "y", 1); len(y) != 1 || y[0].Action != "put" {
		t.Errorf("entry y: %+v", y)
	}
}

// TestBackfillJobs: one unfinished backfill per entry; a request queued
// with it; progress written only by the leader; the finished trimmed.
func TestBackfillJobs(t *testing.T) {
	cli := newClient(t)
	pfx := testPrefix(t)
	s := New(cli, pfx)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	g := lead(t, cli, pfx)
	b := &Backfill{Entry: "e", From: now.Add(-time.Hour), To: now, Rate: 10, Actor: "ops"}
	if err := s.CreateBackfill(ctx, b, &AuditRecord{Actor: "ops", Action: "backfill", Entry: "e"}, now); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateBackfill(ctx, &Backfill{Entry: "e", From: now.Add(-2 * time.Hour), To: now}, nil, now); !errors.Is(err, ErrBackfillBusy) {
		t.Fatalf("a second backfill of e: %v", err)
	}
	reqs, _, err := s.PendingRequests(ctx)
	if err != nil || len(reqs) != 1 || reqs[0].Op != OpBackfill || reqs[0].Backfill != b.ID {
		t.Fatalf("requests %+v %v", reqs, err)
	}
	if recs, _ := s.AuditLog(ctx, "e", 0); len(recs) != 1 || recs[0].Request != b.ID {
		t.Errorf("audit %+v", recs)
	}
	b.State, b.Published = BackfillDone, 60
	if err := s.SaveBackfill(ctx, g, b, reqs[0].Key); err != nil {
		t.Fatal(err)
	}
	if reqs, _, _ := s.PendingRequests(ctx); len(reqs) != 0 {
		t.Errorf("the request outlived its job: %+v", reqs)
	}
	deposed := g
	lead(t, cli, pfx)
	if err := s.SaveBackfill(ctx, deposed, b); !errors.Is(err, ErrNotLeader) {
		t.Errorf("a deposed leader's progress: %v", err)
	}
	got, ok, err := s.Backfill(ctx, b.ID)
	if err != nil || !ok || got.State != BackfillDone || got.Published != 60 {
		t.Errorf("job %+v %v %v", got, ok, err)
	}
	if err := s.CreateBackfill(ctx, &Backfill{Entry: "e", From: now.Add(-2 * time.Hour), To: now}, nil, now); err != nil {
		t.Errorf("a new backfill after the last ended: %v", err)
	}
}
