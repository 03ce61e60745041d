package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

var (
	etcdDir  string
	etcdStop = func() {}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "store-test")
	if err != nil {
		panic(err)
	}
	etcdDir = dir
	code := m.Run()
	etcdStop()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
			goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

const prefix = "/beatd/test/"

// lead creates a leader key the way an election would, and returns its
// guard.
func lead(t *testing.T, cli *clientv3.Client, pfx string) election.Fence {
	t.Helper()
	ctx := context.Background()
	key := pfx + "leader/x"
	// A new key (as a new term's candidate key is): its create revision
	// is this put's.
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(ctx, key, "x")
	if err != nil {
		t.Fatal(err)
	}
	return election.Fence{Key: key, Token: resp.Header.Revision}
}

// runs numbers the tests' prefixes: the package's etcd outlives a test,
// and -count=N runs each test again against it.
var runs atomic.Int64

// testPrefix is a prefix no other test or run uses.
func testPrefix(t *testing.T) string {
	return fmt.Sprintf("%s%s/%d/", prefix, t.Name(), runs.Add(1))
}

// etcdSrv is one embedded etcd for the package: starting one takes
// seconds, and every test uses its own prefix... of the same server.
var etcdOnce struct {
	sync.Once
	eps []string
}

func newClient(t *testing.T) *clientv3.Client {
	t.Helper()
	etcdOnce.Do(func() {
		srv, err := embedetcd.Start(embedetcd.Config{Dir: filepath.Join(etcdDir, "etcd")})
		if err != nil {
			panic(err)
		}
		etcdStop = srv.Close
		etcdOnce.eps = srv.Endpoints
	})
	return testutil.NewEtcdClient(t, etcdOnce.eps...)
}

func TestSaveLoadAndGuard(t *testing.T) {
	cli := newClient(t)
	pfx := testPrefix(t)
	s := New(cli, pfx)
	ctx := context.Background()
	g := lead(t, cli, pfx)

	// More buckets than one transaction may hold, and more than one
	// entry per bucket.
	tab := NewTable()
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for i := 0; i < 3000; i++ {
		tab.Set(EntryState{Name: fmt.Sprintf("e%04d", i), LastSlot: slot.Add(time.Duration(i) * time.Second), Since: slot.Add(-time.Hour)})
	}
	if err := s.Save(ctx, g, tab, nil); err != nil {
		t.Fatal(err)
	}
	if tab.Dirty() != 0 {
		t.Fatalf("%d buckets still dirty after a successful save", tab.Dirty())
	}
	got, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Len() != 3000 {
		t.Fatalf("loaded %d states", got.Len())
	}
	e, _ := got.Get("e0042")
	if !e.LastSlot.Equal(slot.Add(42*time.Second)) || !e.Since.Equal(slot.Add(-time.Hour)) || e.Paused {
		t.Errorf("state = %+v", e)
	}

	// A new leader key (the old one deleted, a new term): the old guard is
	// refused and changes nothing.
	if _, err := cli.Delete(ctx, g.Key); err != nil {
		t.Fatal(err)
	}
	g2 := lead(t, cli, pfx)
	e.Paused = true
	tab.Set(e)
	if err := s.Save(ctx, g, tab, nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("old guard: %v, want ErrNotLeader", err)
	}
	if tab.Dirty() != 1 {
		t.Errorf("a refused write must leave its bucket dirty: %d dirty", tab.Dirty())
	}
	if got, _ := s.Load(ctx); mustGet(t, got, "e0042").Paused {
		t.Fatal("a refused write changed state")
	}
	// Even the same key recreated (same name, new term) has a new revision.
	if err := s.Save(ctx, g2, tab, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Load(ctx); !mustGet(t, got, "e0042").Paused {
		t.Fatal("guarded write lost")
	}
}

func mustGet(t *testing.T, tab *Table, name string) EntryState {
	t.Helper()
	st, ok := tab.Get(name)
	if !ok {
		t.Fatalf("no state for %q", name)
	}
	return st
}

// TestLegacyMigration reads the per-entry JSON of earlier versions and
// replaces it with buckets on the first write.
func TestLegacyMigration(t *testing.T) {
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) { testLegacyMigration(t, warm) })
	}
}

// testLegacyMigration is TestLegacyMigration, with the first Load after
// Warm (its one transaction reads the legacy keys too) or not.
func testLegacyMigration(t *testing.T, warm bool) {
	cli := newClient(t)
	pfx := testPrefix(t)
	s := New(cli, pfx)
	ctx := context.Background()
	g := lead(t, cli, pfx)
	if warm {
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
	}
	legacy := `{"v":1,"name":"old","last_slot":"2026-11-30T10:00:00Z","last_run_at":"2026-11-30T10:00:00.003Z",` +
		`"total_run_count":9,"paused":true,"recent_runs":[{"slot":"2026-11-30T10:00:00Z","published_at":"2026-11-30T10:00:00.003Z","token":3,"task_id":"x"}],` +
		`"since":"2026-11-29T10:00:00Z"}`
	if _, err := cli.Put(ctx, pfx+"entries/old", legacy); err != nil {
		t.Fatal(err)
	}
	tab, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := EntryState{Name: "old", LastSlot: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), Since: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC), Paused: true}
	if got := mustGet(t, tab, "old"); !sameState(got, want) {
		t.Fatalf("legacy state = %+v, want %+v", got, want)
	}
	if err := s.Save(ctx, g, tab, nil); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, pfx+"entries/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("legacy keys left after a full write: %v %v", resp, err)
	}
	tab, _ = s.Load(ctx)
	if got := mustGet(t, tab, "old"); !sameState(got, want) {
		t.Fatalf("migrated state = %+v, want %+v", got, want)
	}
}

func TestNewerFormatRefused(t *testing.T) {
	cli := newClient(t)
	for _, tc := range []struct{ key, val string }{
		{"entries/x", `{"v": 99}`},
		{"state/00", "\x09"},
	} {
		pfx := prefix + t.Name() + "/" + tc.key[:1] + "/"
		if _, err := cli.Put(context.Background(), pfx+tc.key, tc.val); err != nil {
			t.Fatal(err)
		}
		if _, err := New(cli, pfx).Load(context.Background()); err == nil {
			t.Errorf("%s: loaded a format from the future", tc.key)
		}
	}
}

func TestRequests(t *testing.T) {
	cli := newClient(t)
	pfx := testPrefix(t)
	s := New(cli, pfx)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := lead(t, cli, pfx)
	_, rev, err := s.PendingRequests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	notify := s.WatchRequests(ctx, rev)
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	if _, err := s.PutRequest(ctx, Request{Op: OpPause, Entry: "x"}, nil, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRequest(ctx, Request{Op: OpTrigger, Entry: "y"}, nil, now.Add(time.Second)); err != nil {
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
	tab := NewTable()
	tab.Set(EntryState{Name: "x", Paused: true})
	stale := election.Fence{Key: g.Key, Token: g.Token - 1}
	if err := s.Save(ctx, stale, tab, []string{reqs[0].Key}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("stale complete: %v", err)
	}
	if reqs, _, _ := s.PendingRequests(ctx); len(reqs) != 2 {
		t.Fatalf("a refused completion consumed a request: %d left", len(reqs))
	}
	if err := s.Save(ctx, g, tab, []string{reqs[0].Key}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Load(ctx); !mustGet(t, got, "x").Paused {
		t.Error("pause not applied")
	}
	if st, err := s.Get(ctx, "x"); err != nil || !st.Paused {
		t.Errorf("Get after pause: %+v, %v", st, err)
	}
	if st, err := s.Get(ctx, "never"); err != nil || st.Name != "never" || st.Paused || !st.LastSlot.IsZero() {
		t.Errorf("Get of an entry without state: %+v, %v", st, err)
	}
	if reqs, _, _ = s.PendingRequests(ctx); len(reqs) != 1 {
		t.Errorf("%d requests left, want 1", len(reqs))
	}
	cancel()
	for range notify {
	}
}

// TestSaveKeepsWhatItWrote: Save encodes every bucket into one scratch
// buffer, so each bucket the table keeps must be a copy of its own, equal
// to what etcd holds, through a first write and a second that changes
// some buckets and not others.
func TestSaveKeepsWhatItWrote(t *testing.T) {
	cli := newClient(t)
	pfx := testPrefix(t)
	s := New(cli, pfx)
	ctx := context.Background()
	g := lead(t, cli, pfx)
	slot := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	tab := NewTable()
	for i := range 2000 {
		tab.Set(EntryState{Name: fmt.Sprintf("e-%04d", i), LastSlot: slot})
	}
	check := func(when string) {
		t.Helper()
		resp, err := cli.Get(ctx, s.bucketPrefix(), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != tab.Buckets() {
			t.Fatalf("%s: %d keys in etcd, want %d", when, len(resp.Kvs), tab.Buckets())
		}
		for _, kv := range resp.Kvs {
			suffix, _ := BucketAt(s.prefix, kv.Key)
			var b int
			if _, err := fmt.Sscanf(suffix, "%x", &b); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(tab.enc[b], kv.Value) {
				t.Fatalf("%s: bucket %s kept %d bytes unlike the %d in etcd", when, suffix, len(tab.enc[b]), len(kv.Value))
			}
		}
	}
	if err := s.Save(ctx, g, tab, nil); err != nil {
		t.Fatal(err)
	}
	check("first write")
	for i := 0; i < 2000; i += 7 {
		tab.Set(EntryState{Name: fmt.Sprintf("e-%04d", i), LastSlot: slot.Add(time.Hour)})
	}
	if err := s.Save(ctx, g, tab, nil); err != nil {
		t.Fatal(err)
	}
	check("second write")
	loaded, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		want := slot
		if i%7 == 0 {
			want = slot.Add(time.Hour)
		}
		if st, ok := loaded.Get(fmt.Sprintf("e-%04d", i)); !ok || !st.LastSlot.Equal(want) {
			t.Fatalf("e-%04d loaded as %+v, %v; want its last slot %v", i, st, ok, want)
		}
	}
}
