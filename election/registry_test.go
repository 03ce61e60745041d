package election

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRegistry: a replica appears with its address and health, its health
// follows the check, and it leaves the list when it stops.
func TestRegistry(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	var sick atomic.Bool
	health := func(context.Context) error {
		if sick.Load() {
			return errors.New("broker unreachable: connection refused")
		}
		return nil
	}
	var leading atomic.Int64
	elected := time.Date(2026, 11, 30, 9, 30, 0, 0, time.UTC)
	cfgB := RegistryConfig{Client: cli, Prefix: prefix, TTL: 2 * time.Second, Every: 100 * time.Millisecond,
		Leading: func() (int64, time.Time) { return leading.Load(), elected }}
	cfg := RegistryConfig{Client: cli, Prefix: prefix, TTL: 2 * time.Second, Every: 100 * time.Millisecond, Health: health}
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	doneA, doneB := make(chan struct{}), make(chan struct{})
	started := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	go func() {
		defer close(doneA)
		Register(ctxA, cfg, Replica{ID: "a", HTTP: "127.0.0.1:1", Started: started})
	}()
	go func() {
		defer close(doneB)
		Register(ctxB, cfgB, Replica{ID: "b", HTTP: "127.0.0.1:2", Started: started})
	}()
	defer func() { stopA(); stopB(); <-doneA; <-doneB }()

	list := func() []Replica {
		rs, err := Replicas(context.Background(), cli, prefix)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	waitUntil(t, "both registered", func() bool { return len(list()) == 2 })
	rs := list()
	if rs[0].ID != "a" || rs[0].HTTP != "127.0.0.1:1" || !rs[0].Started.Equal(started) || rs[0].Health != "ok" || rs[1].ID != "b" {
		t.Fatalf("replicas = %+v", rs)
	}
	if rs[1].LeaderToken != 0 || !rs[1].LeaderSince.IsZero() {
		t.Fatalf("a standby registered a term: %+v", rs[1])
	}
	leading.Store(42)
	waitUntil(t, "b's term registered", func() bool {
		b := list()[1]
		return b.LeaderToken == 42 && b.LeaderSince.Equal(elected)
	})
	sick.Store(true)
	waitUntil(t, "health reported", func() bool { return list()[0].Health == "broker unreachable: connection refused" })
	stopA()
	<-doneA
	// Stopping revokes the lease: gone at once, not after the TTL.
	if rs := list(); len(rs) != 1 || rs[0].ID != "b" {
		t.Fatalf("after a stopped: %+v", rs)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, what, cond)
}

// TestRegistrationOutlivesSlowRefreshes: the lease is renewed apart from
// the health checks and puts. A refresh slower than the TTL (a health
// check blocked at a 900,000-entry start on 2 cores) used to space two
// renewals past it: the registration lapsed while the replica ran, and
// the other replicas took it for dead.
func TestRegistrationOutlivesSlowRefreshes(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	const p = "/slow-refresh/"
	var slow atomic.Bool
	health := func(ctx context.Context) error {
		if slow.Load() {
			<-ctx.Done() // as long as the refresh allows: Every
		}
		return nil
	}
	// Refreshes 3 s apart (and a health check as long) on a 2 s lease.
	cfg := RegistryConfig{Client: cli, Prefix: p, TTL: 2 * time.Second, Every: 3 * time.Second, Health: health}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Register(ctx, cfg, Replica{ID: "a", HTTP: "127.0.0.1:1"})
	}()
	defer func() { stop(); <-done }()
	waitUntil(t, "registered", func() bool {
		rs, err := Replicas(context.Background(), cli, p)
		return err == nil && len(rs) == 1
	})
	slow.Store(true)
	// Watch the key: a lapse is a delete, however brief.
	wctx, wcancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer wcancel()
	for resp := range cli.Watch(wctx, replicaPrefix(p)+"a") {
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				t.Fatalf("the registration lapsed at revision %d while the replica ran", ev.Kv.ModRevision)
			}
		}
	}
}

// TestRegistrationSaysLoadingAtPoke: the shards a replica loads, and
// whether it is busy or waits for a move, are in its registration as soon
// as it pokes it, not at its next refresh (another replica that reads
// them loads other shards instead, or holds its handover back).
func TestRegistrationSaysLoadingAtPoke(t *testing.T) {
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	var loading atomic.Pointer[[]int]
	loading.Store(&[]int{})
	poke := make(chan struct{}, 1)
	var busy, waiting atomic.Bool
	cfg := RegistryConfig{Client: cli, Prefix: prefix + "loading/", TTL: 2 * time.Second, Every: time.Hour, Poke: poke,
		Loading:  func() []int { return *loading.Load() },
		Activity: func() (bool, bool) { return busy.Load(), waiting.Load() }}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Register(ctx, cfg, Replica{ID: "a"})
	}()
	defer func() { stop(); <-done }()
	get := func() []Replica {
		rs, err := Replicas(context.Background(), cli, cfg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	waitUntil(t, "registered", func() bool { return len(get()) == 1 })
	if rs := get(); len(rs[0].Loading) != 0 {
		t.Fatalf("loading before any load: %+v", rs[0])
	}
	for _, want := range [][]int{{3, 7}, nil} {
		loading.Store(&want)
		poke <- struct{}{}
		testutil.EventuallyEvery(t, 2*time.Second, 10*time.Millisecond, fmt.Sprintf("loading %v registered", want), func() bool {
			return slices.Equal(get()[0].Loading, want)
		})
	}
	for _, want := range [][2]bool{{true, false}, {false, true}, {true, true}, {false, false}} {
		busy.Store(want[0])
		waiting.Store(want[1])
		poke <- struct{}{}
		testutil.EventuallyEvery(t, 2*time.Second, 10*time.Millisecond, fmt.Sprintf("busy, waiting %v registered", want), func() bool {
			r := get()[0]
			return r.Busy == want[0] && r.Waiting == want[1]
		})
	}
}
