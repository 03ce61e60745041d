package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/certgen"
	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestEmbeddedTLSAsProcesses runs the embedded StatefulSet with the
// etcd-tls and http-tls components, from certificates made like `beatd
// certs init` makes them: the members join over mutually authenticated
// peer TLS and serve clients only with a certificate of their CA. A client
// without one, or with one of another CA, is refused; the CLI with the
// right one works. beatd's own HTTP is HTTPS only, and a standby's console
// reads the leader's numbers over it, verifying its certificate.
func TestEmbeddedTLSAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three beatd processes")
	}
	dir := t.TempDir()
	now := time.Now()
	ca, err := certgen.NewCA("beatd test CA", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *certgen.CA, name string, server bool) (string, string) {
		spec := certgen.Spec{CN: name, Client: true, Server: server, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
		if server {
			spec.DNS, spec.IPs = []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}
		}
		c, k, err := ca.Issue(spec)
		if err != nil {
			t.Fatal(err)
		}
		cf, kf := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		if err := certgen.WriteFile(cf, c); err != nil {
			t.Fatal(err)
		}
		if err := certgen.WriteFile(kf, k); err != nil {
			t.Fatal(err)
		}
		return cf, kf
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := certgen.WriteFile(caFile, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	memberCert, memberKey := issue(ca, "member", true)
	cliCert, cliKey := issue(ca, "cli", false)
	other, err := certgen.NewCA("some other CA", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	strangerCert, strangerKey := issue(other, "stranger", false)
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	clientTLS := func(cert, key string) *tls.Config {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca.CertPEM())
		tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		return tc
	}

	rs := testutil.MustStartRedis(t)
	opt := podOptions{broker: rs.URL(0), secrets: map[string]map[string]string{
		"beatd-etcd-tls": {"ca.crt": read(caFile), "tls.crt": read(memberCert), "tls.key": read(memberKey)},
		"beatd-http-tls": {"ca.crt": read(caFile), "tls.crt": read(memberCert), "tls.key": read(memberKey)},
	}}
	ec := startRendering(t, "embedded+https", opt, clientTLS(cliCert, cliKey))
	lead, l := ec.leader("", 0, 60*time.Second)
	ec.healthyMembers(3, 30*time.Second)
	rdb := rs.Client()
	waitFor(t, 15*time.Second, "publishing", func() bool {
		n, _ := rdb.LLen(context.Background(), "deploytest").Result()
		return n >= 2
	})
	t.Logf("three members over TLS with certificate auth; leader %s (token %d)", lead.name, l.Token)

	// beatd's HTTP: HTTPS with the Secret's certificate, the probes' paths
	// answer over it, plain HTTP is refused, and a standby's console
	// reaches the leader at its advertised https URL.
	https := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS("", "")}}
	for _, p := range ec.pods {
		for _, probe := range []string{"/healthz", "/readyz"} {
			resp, err := https.Get("https://" + p.httpAddr + probe)
			if err != nil {
				t.Fatalf("%s %s over HTTPS: %v", p.name, probe, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s %s over HTTPS: %d", p.name, probe, resp.StatusCode)
			}
		}
		if resp, err := http.Get("http://" + p.httpAddr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("%s serves plain HTTP", p.name)
			}
		}
		if adv := p.envValue("BEATD_ADVERTISE_URL"); !strings.HasPrefix(adv, "https://") {
			t.Errorf("%s advertises %q, want https", p.name, adv)
		}
	}
	var standby *pod
	for _, p := range ec.pods {
		if p != lead {
			standby = p
			break
		}
	}
	waitFor(t, 15*time.Second, "the standby's console to show the leader's numbers", func() bool {
		resp, err := https.Get("https://" + standby.httpAddr + "/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		page := string(b)
		return resp.StatusCode == http.StatusOK && strings.Contains(page, `id="leader-id"`) && !strings.Contains(page, "numbers are unavailable")
	})

	var eps []string
	for _, p := range ec.pods {
		eps = append(eps, p.envValue("BEATD_ETCD_ADVERTISE_CLIENT_URL"))
		if !strings.HasPrefix(eps[len(eps)-1], "https://") {
			t.Fatalf("%s advertises %s, want https", p.name, eps[len(eps)-1])
		}
	}
	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{
		{"no client certificate", clientTLS("", "")},
		{"a certificate of another CA", clientTLS(strangerCert, strangerKey)},
	} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop(), TLS: tc.tls})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err = cli.Get(ctx, "/beatd/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			cancel()
			cli.Close()
		}
		if err == nil {
			t.Errorf("%s: the members served it", tc.name)
		} else {
			t.Logf("%s: refused: %v", tc.name, err)
		}
	}

	// The CLI: with the CLI's certificate it reads the cluster; without, it
	// says which etcd refused it.
	cliArgs := []string{"status", "--etcd-endpoints", strings.Join(eps, ","), "--prefix", ec.prefix, "--etcd-cacert", caFile, "--timeout", "5s"}
	out, err := exec.Command(beatdBin(), append(cliArgs, "--etcd-cert", cliCert, "--etcd-key", cliKey)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "leader: "+lead.name) {
		t.Errorf("beatd status with the CLI's certificate: %v\n%s", err, out)
	}
	out, err = exec.Command(beatdBin(), cliArgs...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refused this client: remote error: tls: certificate required") {
		t.Errorf("beatd status without a certificate: %v\n%s", err, out)
	}
	out, err = exec.Command(beatdBin(), append(cliArgs, "--etcd-cert", strangerCert, "--etcd-key", strangerKey)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refused this client: remote error: tls:") {
		t.Errorf("beatd status with another CA's certificate: %v\n%s", err, out)
	}
	t.Logf("the CLI with another CA's certificate: %s", strings.TrimSpace(string(out)))
	// A SIGTERM'd leader hands over and exits within 2 s, its member's
	// close bounded (the other replicas' watch streams used to hold it
	// for up to etcd's request timeout).
	termAt := time.Now()
	if !lead.term(30 * time.Second) {
		t.Fatalf("%s did not exit within 30s of SIGTERM", lead.name)
	}
	exit := time.Since(termAt)
	next, l2 := ec.leader(lead.name, l.Token, 10*time.Second)
	t.Logf("SIGTERM of the leader %s: exited after %s; %s leads (token %d) %s after the signal",
		lead.name, exit.Round(10*time.Millisecond), next.name, l2.Token, time.Since(termAt).Round(10*time.Millisecond))
	if exit > 2500*time.Millisecond { // 2 s, and a margin for a loaded machine
		t.Errorf("a SIGTERM'd embedded replica took %s to exit, want within 2 s", exit)
	}
	// With client certificate auth there is nothing to warn about.
	for _, p := range ec.pods {
		if b, _ := os.ReadFile(p.log); strings.Contains(string(b), "without client certificate auth") {
			t.Errorf("%s warns about an unauthenticated client port", p.name)
		}
	}
}
