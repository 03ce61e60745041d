package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
	)
}

const prefix = "/beatd/test/"

// lead creates a leader key the way an election would, and returns its
// guard.
func lead(t *testing.T, cli *clientv3.Client, id string) Guard {
	t.Helper()
	ctx := context.Background()
	key := prefix + "leader/" + id
	resp, err := cli.Put(ctx, key, id)
	if err != nil {
		t.Fatal(err)
	}
	return Guard{Key: key, Token: resp.Header.Revision}
}

func TestSaveLoadAndGuard(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	s := New(cli, prefix)
	ctx := context.Background()
	g := lead(t, cli, "a")

	// More entries than one transaction may hold.
	var states []*EntryState
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for i := 0; i < 300; i++ {
		st := &EntryState{Name: fmt.Sprintf("e%03d", i)}
		for r := 0; r < 25; r++ {
			st.Record(Run{Slot: slot.Add(time.Duration(r) * time.Minute), PublishedAt: slot.Add(time.Duration(r)*time.Minute + 3*time.Millisecond), Token: g.Token, TaskID: "id"})
		}
		states = append(states, st)
	}
	if err := s.Save(ctx, g, states); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 300 {
		t.Fatalf("loaded %d states", len(got))
	}
	e := got["e042"]
	if e.TotalRunCount != 25 || len(e.Recent) != RecentRuns || !e.LastSlot.Equal(slot.Add(24*time.Minute)) || e.Version != formatVersion {
		t.Errorf("state = %+v", e)
	}
	if !e.Recent[0].Slot.Equal(slot.Add(5 * time.Minute)) {
		t.Errorf("oldest kept run is %s, want the 6th", e.Recent[0].Slot)
	}

	// A new leader key (the old one deleted, a new term): the old guard is
	// refused and changes nothing.
	if _, err := cli.Delete(ctx, g.Key); err != nil {
		t.Fatal(err)
	}
	g2 := lead(t, cli, "b")
	e.Paused = true
	if err := s.Save(ctx, g, []*EntryState{e}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("old guard: %v, want ErrNotLeader", err)
	}
	if st, _ := s.Get(ctx, "e042"); st.Paused {
		t.Fatal("a refused write changed state")
	}
	// Even the same key recreated (same name, new term) has a new revision.
	if err := s.Save(ctx, g2, []*EntryState{e}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Get(ctx, "e042"); !st.Paused {
		t.Fatal("guarded write lost")
	}
}

func TestNewerFormatRefused(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	if _, err := cli.Put(context.Background(), prefix+"entries/x", `{"v": 99}`); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cli, prefix).Load(context.Background()); err == nil {
		t.Fatal("loaded a format from the future")
	}
}

func TestPrune(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	s := New(cli, prefix)
	ctx := context.Background()
	g := lead(t, cli, "a")
	if err := s.Save(ctx, g, []*EntryState{{Name: "kept"}, {Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	states, _ := s.Load(ctx)
	configured := map[string]bool{"kept": true}
	if err := s.Prune(ctx, g, states, configured, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	states, _ = s.Load(ctx)
	if states["gone"] == nil || !states["gone"].RemovedAt.Equal(now) {
		t.Fatalf("removed entry not marked: %+v", states["gone"])
	}
	// Within the grace period: kept. After it: deleted.
	if err := s.Prune(ctx, g, states, configured, now.Add(30*time.Minute), time.Hour); err != nil {
		t.Fatal(err)
	}
	if states, _ = s.Load(ctx); states["gone"] == nil {
		t.Fatal("deleted within the grace period")
	}
	if err := s.Prune(ctx, g, states, configured, now.Add(2*time.Hour), time.Hour); err != nil {
		t.Fatal(err)
	}
	if states, _ = s.Load(ctx); states["gone"] != nil || states["kept"] == nil {
		t.Fatalf("after grace: %v", states)
	}
}

func TestRequests(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	s := New(cli, prefix)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := lead(t, cli, "a")
	_, rev, err := s.PendingRequests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	notify := s.WatchRequests(ctx, rev)
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	if _, err := s.PutRequest(ctx, OpPause, "x", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRequest(ctx, OpTrigger, "y", now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-notify:
	case <-time.After(5 * time.Second):
		t.Fatal("no watch notification")
	}
	reqs, _, err := s.PendingRequests(ctx)
	if err != nil || len(reqs) != 2 || reqs[0].Op != OpPause || reqs[1].Entry != "y" {
		t.Fatalf("pending = %+v, %v", reqs, err)
	}
	// A deposed leader can neither apply nor consume a request.
	stale := Guard{Key: g.Key, Token: g.Token - 1}
	if err := s.CompleteRequest(ctx, stale, reqs[0], &EntryState{Name: "x", Paused: true}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("stale complete: %v", err)
	}
	if err := s.CompleteRequest(ctx, g, reqs[0], &EntryState{Name: "x", Paused: true}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Get(ctx, "x"); !st.Paused {
		t.Error("pause not applied")
	}
	if reqs, _, _ = s.PendingRequests(ctx); len(reqs) != 1 {
		t.Errorf("%d requests left, want 1", len(reqs))
	}
	cancel()
	for range notify {
	}
}
