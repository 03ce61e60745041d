package sources

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

var (
	etcdDir  string
	etcdStop = func() {}
	pgStop   = func() {}
	etcdOnce struct {
		sync.Once
		eps []string
	}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sources-test")
	if err != nil {
		panic(err)
	}
	etcdDir = dir
	code := m.Run()
	etcdStop()
	pgStop()
	os.RemoveAll(dir)
	if code == 0 {
		// Every Sync, WriteBack and database handle stopped with its test.
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

// etcdClient starts one embedded etcd for the package (it takes seconds)
// and returns a client; each test uses its own prefix.
func etcdClient(t *testing.T) *clientv3.Client {
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

func TestEntriesPreconditions(t *testing.T) {
	t.Parallel()
	cli := etcdClient(t)
	ctx := context.Background()
	s := NewEntries(cli, "/t/"+t.Name()+"/")
	doc := func(name, data string) []Doc { return []Doc{{Name: name, Data: []byte(data)}} }

	// Create-only (If-None-Match: *) twice: the second is a conflict.
	rev1, err := s.Put(ctx, doc("a", `{"v":1}`), map[string]int64{"a": 0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, doc("a", `{"v":2}`), map[string]int64{"a": 0}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("second create: %v", err)
	}
	// Two writers read rev1; the first wins, the second gets a conflict.
	rev2, err := s.Put(ctx, doc("a", `{"v":3}`), map[string]int64{"a": rev1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, doc("a", `{"v":4}`), map[string]int64{"a": rev1}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("lost update not refused: %v", err)
	}
	got, err := s.Get(ctx, "a")
	if err != nil || string(got.Data) != `{"v":3}` || got.ModRevision != rev2 {
		t.Fatalf("get: %+v %v", got, err)
	}
	// A set is one transaction: one failed condition writes nothing.
	_, err = s.Put(ctx, []Doc{{Name: "b", Data: []byte(`{}`)}, {Name: "a", Data: []byte(`{"v":5}`)}}, map[string]int64{"a": rev1})
	if !errors.Is(err, ErrPrecondition) {
		t.Fatalf("set with stale revision: %v", err)
	}
	if _, err := s.Get(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a failed set wrote part of itself: %v", err)
	}
	// Delete: stale revision, then right, then gone.
	if err := s.Delete(ctx, "a", rev1); !errors.Is(err, ErrPrecondition) {
		t.Errorf("stale delete: %v", err)
	}
	if err := s.Delete(ctx, "a", rev2); err != nil {
		t.Errorf("delete: %v", err)
	}
	if err := s.Delete(ctx, "a", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete of a missing entry: %v", err)
	}
}

// TestEntriesSync checks that a write reaches the merged config promptly,
// and a delete removes the entry.
func TestEntriesSync(t *testing.T) {
	t.Parallel()
	cli := etcdClient(t)
	s := NewEntries(cli, "/t/"+t.Name()+"/")
	applied := make(chan *config.Config, 16)
	m := New(Config{Apply: func(c *config.Config) error { applied <- c; return nil }})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Sync(ctx, m, 0) })
	defer func() { cancel(); wg.Wait() }()
	wait := func(what string, ok func(*config.Config) bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case c := <-applied:
				if ok(c) {
					return
				}
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	wait("the first sync", func(c *config.Config) bool { return len(c.Entries) == 0 })
	start := time.Now()
	if _, err := s.Put(context.Background(), []Doc{{Name: "x", Data: []byte(`{"task":"t","every":"1s"}`)}}, nil); err != nil {
		t.Fatal(err)
	}
	wait("x to appear", func(c *config.Config) bool { return c.Entry("x") != nil && c.Entry("x").Source == API })
	t.Logf("put to merged config: %s", time.Since(start))
	if err := s.Delete(context.Background(), "x", 0); err != nil {
		t.Fatal(err)
	}
	wait("x to go", func(c *config.Config) bool { return c.Entry("x") == nil })
}
