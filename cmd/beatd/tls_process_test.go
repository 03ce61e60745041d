package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/certgen"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestProcessHTTPS: --http-tls-cert serves the API, the console and the
// probes over HTTPS; the CLI works over it with --server-cacert; a
// certificate rotated on disk is served without a restart; --metrics-http
// serves probes and metrics, and no other route, in plain HTTP.
func TestProcessHTTPS(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := certgen.NewCA("beatd test CA", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	issue := func(cn string) {
		t.Helper()
		c, k, err := ca.Issue(certgen.Spec{CN: cn, Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		// As cert-manager and kubelet do: new files renamed into place.
		for path, b := range map[string][]byte{certFile: c, keyFile: k} {
			if err := certgen.WriteFile(path+".new", b); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := certgen.WriteFile(caFile, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	issue("first")
	metricsPort := testutil.FreePort(t)
	c := newCluster(t, "entries:\n  a: {task: tasks.add, every: 1s}\n", 0)
	r := c.startReplica("r0", "--http-tls-cert", certFile, "--http-tls-key", keyFile, "--http-tls-ca", caFile, "--metrics-http", "127.0.0.1:"+strconv.Itoa(metricsPort))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	r.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	r.waitHealthy()
	c.leader("", 20*time.Second)
	https := "https://127.0.0.1:" + strconv.Itoa(r.HTTPPort)
	servedCN := func() string {
		conn, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(r.HTTPPort), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
		if err != nil {
			return "error: " + err.Error()
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := servedCN(); cn != "first" {
		t.Fatalf("served %q", cn)
	}
	// Plain HTTP on the TLS port is refused.
	if resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(r.HTTPPort) + "/status"); err == nil && resp.StatusCode == 200 {
		t.Error("plain HTTP served on the HTTPS port")
	}
	// The CLI over HTTPS, with and without the CA.
	cmd := exec.Command(beatdBin, "entries", "list", "--server", https, "--server-cacert", caFile)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "NAME") {
		t.Errorf("entries list over https: %v\n%s", err, out)
	}
	if out, err := exec.Command(beatdBin, "entries", "list", "--server", https).CombinedOutput(); err == nil || !strings.Contains(string(out), "certificate") {
		t.Errorf("entries list without the CA: %v\n%s", err, out)
	}
	// status reads the leader's https status URL, with the CA.
	code, out, errs := c.cli("status", "--server-cacert", caFile)
	if code != 0 || strings.Contains(errs, "leader at") || !strings.Contains(out, "leader: r0") {
		t.Errorf("status over https: exit %d\n%s\n%s", code, out, errs)
	}
	// The console over HTTPS, with the leader's data read over HTTPS too
	// (--http-tls-ca).
	var page string
	defer func() {
		if t.Failed() {
			t.Logf("last console page:\n%s", page)
		}
	}()
	waitFor(t, 10*time.Second, "the console with the leader's data", func() bool {
		resp, err := r.Client().Get(https + "/entry/a")
		if err != nil {
			page = err.Error()
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		page = string(b)
		return resp.StatusCode == 200 && strings.Contains(string(b), "<code>a</code>") && !strings.Contains(string(b), "The leader&#39;s own numbers are unavailable") && !strings.Contains(string(b), "own numbers are unavailable")
	})
	// Rotation: the new certificate is served without a restart.
	issue("rotated")
	waitFor(t, 5*time.Second, "the rotated certificate", func() bool { return servedCN() == "rotated" })
	if !logHas(r, "TLS certificate reloaded") {
		t.Error("no log line of the reload")
	}
	// The plain listener: probes and metrics only.
	plain := "http://127.0.0.1:" + strconv.Itoa(metricsPort)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/status": 404, "/api/v1/entries": 404, "/": 404} {
		resp, err := http.Get(plain + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("--metrics-http %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if resp, err := http.Post(plain+"/entries/a/trigger", "", nil); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 404 && resp.StatusCode != 405 {
			t.Errorf("--metrics-http serves an admin route: %d", resp.StatusCode)
		}
	}
}

// TestProcessBadTLSFiles: each bad certificate, key or CA is one error
// line at start that names the file, and beatd does not start.
func TestProcessBadTLSFiles(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := certgen.NewCA("beatd test CA", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := certgen.WriteFile(p, b); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, goodKey, _ := ca.Issue(certgen.Spec{CN: "good", Server: true, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	_, otherKey, _ := ca.Issue(certgen.Spec{CN: "other", Server: true, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	expired, expiredKey, _ := ca.Issue(certgen.Spec{CN: "old", Server: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)})
	goodCert, goodKeyFile := write("good.crt", good), write("good.key", goodKey)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"expired", []string{"--http-tls-cert", write("old.crt", expired), "--http-tls-key", write("old.key", expiredKey)}, "old.crt expired at"},
		{"key of another certificate", []string{"--http-tls-cert", goodCert, "--http-tls-key", write("other.key", otherKey)}, "other.key: tls: private key does not match public key"},
		{"CA not PEM", []string{"--http-tls-cert", goodCert, "--http-tls-key", goodKeyFile, "--http-tls-ca", write("ca.txt", []byte("not a certificate"))}, "ca.txt: no PEM certificate"},
		{"etcd CA not PEM", []string{"--etcd-endpoints", "https://127.0.0.1:1", "--etcd-cacert", write("etcd-ca.txt", []byte("nope"))}, "etcd-ca.txt: no PEM certificate"},
		{"etcd client key missing", []string{"--etcd-endpoints", "https://127.0.0.1:1", "--etcd-cert", goodCert}, "good.crt has no key"},
		{"member client cert expired", []string{"--etcd-initial-cluster", "a=https://127.0.0.1:2380", "--etcd-name", "a", "--etcd-advertise-client-url", "https://127.0.0.1:2379",
			"--etcd-client-cert-file", write("m-old.crt", expired), "--etcd-client-key-file", write("m-old.key", expiredKey)}, "m-old.crt expired at"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(beatdBin, append([]string{"run", "--config", "/nonexistent.yaml"}, tt.args...)...)
			out, err := cmd.CombinedOutput()
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if err == nil || !strings.Contains(lines[0], tt.want) {
				t.Errorf("exit %v, first line %q, want it to contain %q\n%s", err, lines[0], tt.want, out)
			}
		})
	}
}
