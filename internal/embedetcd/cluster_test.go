package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// freePort is testutil.FreePort, which this package cannot import (testutil
// imports it).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestClusterBootstrapMoveLeader runs three in-process members with peer
// auto TLS: they bootstrap together, the client knows every member, and
// the raft leader hands leadership away while asked to.
func TestClusterBootstrapMoveLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd members")
	}
	const n = 3
	cfgs := make([]Config, n)
	var ic []string
	for i := range cfgs {
		name := "m" + strconv.Itoa(i)
		peer := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
		cfgs[i] = Config{Dir: filepath.Join(t.TempDir(), "etcd"), Name: name, AdvertisePeerURL: peer, PeerAutoTLS: true,
			AdvertiseClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
		ic = append(ic, name+"="+peer)
	}
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(ic, ",")
		cfgs[i].ListenPeerURL = cfgs[i].AdvertisePeerURL
		cfgs[i].ListenClientURL = cfgs[i].AdvertiseClientURL
	}
	srvs := make([]*Server, n)
	startAll := func(idx ...int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for _, i := range idx {
			wg.Add(1)
			go func() {
				defer wg.Done()
				srvs[i], errs[i] = Start(cfgs[i])
			}()
		}
		wg.Wait()
		for _, i := range idx {
			if errs[i] != nil {
				t.Fatalf("member %d: %v", i, errs[i])
			}
		}
	}
	startAll(0, 1, 2)
	t.Cleanup(func() {
		for _, s := range srvs {
			if s != nil {
				s.Close()
			}
		}
	})
	// Every member's client URL, once each has published it (the list at
	// start has those started by then; the client follows the rest).
	// harness.Poll, not testutil, which imports this package.
	if err := harness.Poll(context.Background(), 10*time.Second, 50*time.Millisecond, func() error {
		if urls := srvs[0].ClientURLs(); len(urls) != n {
			return fmt.Errorf("client URLs %v, want every member's", urls)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(srvs[0].Endpoints) == 0 {
		t.Fatal("no client endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: srvs[0].Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}

	// The raft leader gives leadership away while asked to.
	lead := -1
	for i, s := range srvs {
		if s.IsRaftLeader() {
			lead = i
		}
	}
	if lead < 0 {
		t.Fatal("no raft leader")
	}
	actx, acancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); srvs[lead].AvoidRaftLeadership(actx, nil) }()
	if err := harness.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() error {
		if srvs[lead].IsRaftLeader() {
			return errors.New("raft leadership did not move")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	acancel()
	<-done

	// The wiped-volume rejoin runs in deploy's TestEmbeddedStatefulSetAsProcesses.
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("after the transfer: %v %v", resp, err)
	}

	// A member removed from the cluster (scaled down) that comes back on
	// its old volume moves the dead data aside and joins afresh.
	victim := (lead + 1) % n
	for srvs[victim].IsRaftLeader() {
		victim = (victim + 1) % n
	}
	oldID := srvs[victim].etcd.Server.MemberID()
	srvs[victim].Close()
	srvs[victim] = nil
	// etcd refuses to remove a member it still sees as connected while
	// the others have not been connected for its health interval (5 s):
	// on a slow machine the cluster can be younger than that here. An
	// operator retries; so does the test.
	if err := harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, func() error {
		_, err := cli.MemberRemove(ctx, uint64(oldID))
		if errors.Is(err, rpctypes.ErrUnhealthy) {
			return err
		}
		if err != nil {
			return fmt.Errorf("%w: %w", err, harness.ErrGaveUp)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	startAll(victim)
	if newID := srvs[victim].etcd.Server.MemberID(); newID == oldID {
		t.Fatalf("the removed member restarted under its old id %s", oldID)
	}
	aside, _ := filepath.Glob(cfgs[victim].Dir + ".removed-*")
	if len(aside) != 1 {
		t.Errorf("old data moved aside: %v", aside)
	}
	ml, err := cli.MemberList(ctx)
	if err != nil || len(ml.Members) != n {
		t.Fatalf("members after the rejoin: %v %v", ml, err)
	}
}

func TestApplyClusterErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no client URL", Config{Name: "a", InitialCluster: "a=http://h:2380"}, "advertise client URL"},
		{"not a member", Config{Name: "z", InitialCluster: "a=http://h:2380", AdvertiseClientURL: "http://h:2379"}, "not in the initial cluster"},
		{"mismatch", Config{Name: "a", InitialCluster: "a=http://h:2380", AdvertisePeerURL: "http://x:2380", AdvertiseClientURL: "http://h:2379"}, "advertise peer URL is"},
		{"https without TLS", Config{Name: "a", InitialCluster: "a=https://h:2380", AdvertiseClientURL: "http://h:2379"}, "needs peer certificate"},
		{"TLS on http", Config{Name: "a", InitialCluster: "a=http://h:2380", AdvertiseClientURL: "http://h:2379", PeerAutoTLS: true}, "must be https"},
		{"bad URL", Config{Name: "a", InitialCluster: "a=http://h:2380", AdvertiseClientURL: "h:2379"}, "not an http(s)://host:port URL"},
		{"bad list", Config{Name: "a", InitialCluster: "a", AdvertiseClientURL: "http://h:2379"}, "initial cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Dir = t.TempDir()
			_, err := Start(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestListenFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ adv, want string }{
		{"https://beatd-0.beatd.invalid:2380", "https://0.0.0.0:2380"},
		{"http://10.1.2.3:2379", "http://0.0.0.0:2379"},
		{"http://127.0.0.12:2379", "http://127.0.0.12:2379"},
		{"https://[::1]:2380", "https://[::1]:2380"},
	} {
		u, err := url.Parse(tc.adv)
		if err != nil {
			t.Fatal(err)
		}
		if got := listenFor(*u); got.String() != tc.want {
			t.Errorf("listenFor(%s) = %s, want %s", tc.adv, got.String(), tc.want)
		}
	}
}
