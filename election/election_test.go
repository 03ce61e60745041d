package election

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// etcd's embedded server and zap keep package-level workers.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/traceutil.(*Trace).LogIfLong"),
	)
}

const prefix = "/beatd/test/"

func newElector(t *testing.T, cli *clientv3.Client, id string, ttl time.Duration) *Elector {
	t.Helper()
	e, err := New(Config{Client: cli, Prefix: prefix, ID: id, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func campaign(t *testing.T, e *Elector, timeout time.Duration) *Leadership {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l, err := e.Campaign(ctx)
	if err != nil {
		t.Fatalf("campaign: %v", err)
	}
	t.Cleanup(func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer rcancel()
		_ = l.Resign(rctx)
	})
	return l
}

// candidates runs n replicas that campaign in a loop and records who
// leads. It returns a function that stops them all.
type candidates struct {
	mu      sync.Mutex
	leading map[string]*Leadership
	terms   []term
	overlap bool
	writes  []write // guarded writes that committed
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

type term struct {
	id    string
	token int64
}

type write struct {
	rev, token int64
}

// writeWhileLeading commits guarded writes until l ends, recording each
// commit's revision: the order etcd applied them in.
func (c *candidates) writeWhileLeading(ctx context.Context, cli *clientv3.Client, l *Leadership) {
	for l.Context().Err() == nil && ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.Key), "=", l.Token)).
			Then(clientv3.OpPut(prefix+"probe", fmt.Sprint(l.Token))).Commit()
		cancel()
		if err == nil && resp.Succeeded {
			c.mu.Lock()
			c.writes = append(c.writes, write{resp.Header.Revision, l.Token})
			c.mu.Unlock()
		}
		time.Sleep(5 * time.Millisecond) // paces a load loop; it waits for nothing
	}
}

func runCandidates(t *testing.T, endpoints []string, n int, ttl time.Duration) *candidates {
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidates{leading: map[string]*Leadership{}, cancel: cancel}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("r%d", i)
		cli := testutil.NewEtcdClient(t, endpoints...)
		e := newElector(t, cli, id, ttl)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for ctx.Err() == nil {
				l, err := e.Campaign(ctx)
				if err != nil {
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				c.mu.Lock()
				if len(c.leading) > 0 {
					c.overlap = true
				}
				c.leading[id] = l
				c.terms = append(c.terms, term{id, l.Token})
				c.mu.Unlock()
				c.writeWhileLeading(ctx, cli, l)
				c.mu.Lock()
				delete(c.leading, id)
				c.mu.Unlock()
				rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = l.Resign(rctx)
				rcancel()
			}
		}()
	}
	t.Cleanup(c.stop)
	return c
}

func (c *candidates) stop() {
	c.cancel()
	c.wg.Wait()
}

// checkFencing: in etcd's commit order, tokens never go back, so no write
// of a deposed leader landed after its successor's.
func (c *candidates) checkFencing(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := append([]write(nil), c.writes...)
	sort.Slice(ws, func(i, j int) bool { return ws[i].rev < ws[j].rev })
	for i := 1; i < len(ws); i++ {
		if ws[i].token < ws[i-1].token {
			t.Errorf("write with token %d committed at rev %d after token %d at rev %d", ws[i].token, ws[i].rev, ws[i-1].token, ws[i-1].rev)
		}
	}
	if len(ws) == 0 {
		t.Error("no guarded write committed")
	}
}

func (c *candidates) current() (string, *Leadership, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, l := range c.leading {
		return id, l, len(c.leading)
	}
	return "", nil, 0
}

// waitLeader waits until some candidate other than not leads.
func (c *candidates) waitLeader(t *testing.T, not int64, timeout time.Duration) (string, *Leadership) {
	t.Helper()
	var id string
	var l *Leadership
	testutil.EventuallyEvery(t, timeout, 10*time.Millisecond, "a new leader", func() bool {
		id, l, _ = c.current()
		return l != nil && l.Token != not && l.Context().Err() == nil
	})
	return id, l
}

func TestOneLeaderAndHandover(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	c := runCandidates(t, srv.Endpoints, 3, 2*time.Second)
	id, l := c.waitLeader(t, 0, 10*time.Second)
	obs, err := Observe(context.Background(), testutil.NewEtcdClient(t, srv.Endpoints...), prefix)
	if err != nil || obs.ID != id || obs.Token != l.Token {
		t.Fatalf("Observe = %+v, %v; want %s/%d", obs, err, id, l.Token)
	}
	st := testutil.NewEtcdClient(t, srv.Endpoints...)
	old := l.Fence
	if err := guardedPut(context.Background(), st, old); err != nil {
		t.Fatalf("leader write: %v", err)
	}
	// Resign: a standby leads at once, with a larger token, and the old
	// token's writes are refused.
	start := time.Now()
	if err := l.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	id2, l2 := c.waitLeader(t, l.Token, 5*time.Second)
	c.mu.Lock()
	if c.overlap {
		t.Error("two candidates led at the same moment across a resign")
	}
	c.mu.Unlock()
	if took := time.Since(start); took > time.Second {
		t.Errorf("handover after resign took %s", took)
	}
	if id2 == id || l2.Token <= l.Token {
		t.Errorf("new leader %s token %d after %s token %d", id2, l2.Token, id, l.Token)
	}
	if err := guardedPut(context.Background(), st, old); !errors.Is(err, errNotHeld) {
		t.Fatalf("deposed write: %v, want errNotHeld", err)
	}
	// Lose the lease outright (as when the process dies): another leads.
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	leases, err := cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := cli.Get(context.Background(), l2.Key)
	for _, ls := range leases.Leases {
		if len(resp.Kvs) > 0 && clientv3.LeaseID(resp.Kvs[0].Lease) == ls.ID {
			if _, err := cli.Revoke(context.Background(), ls.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, l3 := c.waitLeader(t, l2.Token, 5*time.Second)
	if l3.Token <= l2.Token {
		t.Errorf("token %d not above %d", l3.Token, l2.Token)
	}
	select {
	case <-l2.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("revoked leader did not notice")
	}
	c.stop()
	c.checkFencing(t)
	for i := 1; i < len(c.terms); i++ {
		if c.terms[i].token <= c.terms[i-1].token {
			t.Errorf("tokens not increasing: %v", c.terms)
		}
	}
}

func TestObserveNoLeader(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	_, err := Observe(context.Background(), testutil.NewEtcdClient(t, srv.Endpoints...), prefix)
	if !errors.Is(err, ErrNoLeader) {
		t.Fatalf("err = %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	cli := &clientv3.Client{}
	for _, cfg := range []Config{
		{Prefix: prefix, ID: "a"},
		{Client: cli, Prefix: prefix, ID: "a", TTL: 500 * time.Millisecond},
		{Client: cli, Prefix: prefix, ID: "a", TTL: 2 * time.Second, SafetyMargin: 3 * time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v): want an error", cfg)
		}
	}
}

var errNotHeld = errors.New("fence not held")

// guardedPut writes under prefix in a transaction guarded by f, as the
// state and the catalog do.
func guardedPut(ctx context.Context, cli *clientv3.Client, f Fence) error {
	resp, err := cli.Txn(ctx).If(f.Held()).Then(clientv3.OpPut(prefix+"guarded", "x")).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return errNotHeld
	}
	return nil
}
