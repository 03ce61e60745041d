package embedetcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/certgen"
	"github.com/beatd/beatd/testkit/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// syncBuffer is a log sink for a member that logs from its own goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPeerMTLS: three members with certificates of one CA bootstrap over
// mutually authenticated peer TLS (--etcd-peer-cert-file, -key-file,
// -trusted-ca-file, peer client cert auth). A member whose certificate is
// of another CA than the one it is told to trust is refused at start,
// naming both files; one whose certificate and CA are both another's
// never joins, and says that the peers refuse its TLS, and why.
func TestPeerMTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four etcd members")
	}
	dir := t.TempDir()
	now := time.Now()
	files := func(cn string) (cert, key, ca string) {
		t.Helper()
		c, err := certgen.NewCA(cn+" CA", now.Add(-time.Hour), 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		ca = filepath.Join(dir, cn+"-ca.crt")
		if err := certgen.WriteFile(ca, c.CertPEM()); err != nil {
			t.Fatal(err)
		}
		pem, k, err := c.Issue(certgen.Spec{CN: cn, Client: true, Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")},
			DNS: []string{"localhost"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		cert, key = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
		if err := certgen.WriteFile(cert, pem); err != nil {
			t.Fatal(err)
		}
		if err := certgen.WriteFile(key, k); err != nil {
			t.Fatal(err)
		}
		return cert, key, ca
	}
	cert, key, ca := files("members")
	strangerCert, strangerKey, strangerCA := files("stranger")

	const n = 3
	cfgs := make([]Config, n)
	var ic []string
	for i := range cfgs {
		name := "m" + strconv.Itoa(i)
		peer := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
		cfgs[i] = Config{Dir: filepath.Join(dir, name), Name: name, AdvertisePeerURL: peer, ListenPeerURL: peer,
			AdvertiseClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
			PeerCertFile:       cert, PeerKeyFile: key, PeerTrustedCAFile: ca, PeerClientCertAuth: true}
		cfgs[i].ListenClientURL = cfgs[i].AdvertiseClientURL
		ic = append(ic, name+"="+peer)
	}
	srvs := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(ic, ",")
		wg.Go(func() { srvs[i], errs[i] = Start(cfgs[i]) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range srvs {
			if s != nil {
				s.Close()
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d over mTLS: %v", i, err)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: srvs[0].Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/mtls", "ok"); err != nil {
		t.Fatalf("a write to the mTLS cluster: %v", err)
	}
	members, err := cli.MemberList(ctx)
	if err != nil || len(members.Members) != n {
		t.Fatalf("members: %v %v", members, err)
	}

	// A certificate of another CA than the one trusted: refused at once.
	bad := cfgs[0]
	bad.Dir, bad.PeerCertFile, bad.PeerKeyFile = filepath.Join(dir, "bad"), strangerCert, strangerKey
	if _, err := Start(bad); err == nil || !strings.Contains(err.Error(), "is not signed by the peer CA "+ca) ||
		!strings.Contains(err.Error(), strangerCert) {
		t.Fatalf("a member certificate of another CA: %v", err)
	}

	// A member of another CA altogether, joining (not in the list the
	// cluster was made with): the members refuse it, and it says why.
	strangerCfg := func(name string, initial []string) Config {
		peer := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
		c := Config{Dir: filepath.Join(dir, name), Name: name, AdvertisePeerURL: peer, ListenPeerURL: peer,
			AdvertiseClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), InitialCluster: strings.Join(initial, ","),
			PeerCertFile: strangerCert, PeerKeyFile: strangerKey, PeerTrustedCAFile: strangerCA, PeerClientCertAuth: true}
		c.ListenClientURL = c.AdvertiseClientURL
		return c
	}
	_, err = Start(strangerCfg("m3", ic))
	if err == nil || !strings.Contains(err.Error(), "refuse its peer TLS") || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("a joining member of another CA: %v", err)
	}
	t.Logf("a joining member of another CA: %v", err)
	// One listed as a bootstrap member: it waits for a quorum that never
	// comes, and says why while it waits.
	defer func(d time.Duration) { waitTick = d }(waitTick)
	waitTick = 300 * time.Millisecond
	var logs syncBuffer
	// It waits until it has said why (or 20 s), then gives up.
	jctx, jcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer jcancel()
	go func() {
		_ = harness.Poll(jctx, 20*time.Second, 50*time.Millisecond, func() error {
			if !strings.Contains(logs.String(), "peers refuse its TLS") {
				return errors.New("not said yet")
			}
			return nil
		})
		jcancel()
	}()
	m4 := strangerCfg("m4", nil)
	m4.InitialCluster = strings.Join(append(slices.Clone(ic), "m4="+m4.AdvertisePeerURL), ",")
	m4.ClusterLog, m4.Context = slog.New(slog.NewTextHandler(&logs, nil)), jctx
	if s, err := Start(m4); err == nil {
		s.Close()
		t.Fatal("a bootstrap member of another CA formed a cluster")
	}
	if out := logs.String(); !strings.Contains(out, "peers refuse its TLS") || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Fatalf("the waiting member's log does not say why:\n%s", out)
	}
	// A context of its own: the stranger's wait may have outlived ctx's.
	mctx, mcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer mcancel()
	members, err = cli.MemberList(mctx)
	if err != nil {
		t.Fatalf("after the stranger: %v", err)
	}
	if len(members.Members) != n {
		t.Fatalf("after the stranger: %d members, want %d", len(members.Members), n)
	}
}
