package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCertsInit: the members' certificate verifies, for server and client
// auth, under every stable name of the StatefulSet's pods (and a pod added
// later), the CLI's for client auth only; nothing is overwritten.
func TestCertsInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	code, out, errs := runCLI(t, "certs", "init", "--dir", dir, "--namespace", "jobs", "--replicas", "2")
	if code != 0 || !strings.Contains(out, "kubectl -n jobs create secret generic beatd-etcd-tls") {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	load := func(name string) *x509.Certificate {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	roots := x509.NewCertPool()
	roots.AddCert(load("ca.crt"))
	member, cli := load("tls.crt"), load("cli.crt")
	for _, name := range []string{"beatd-0.beatd", "beatd-1.beatd.jobs.svc.cluster.local", "beatd-1", "beatd-5.beatd", "beatd-5.beatd.jobs.svc", "localhost", "127.0.0.1"} {
		for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := member.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
				t.Errorf("member certificate for %s (usage %v): %v", name, use, err)
			}
		}
	}
	if _, err := member.Verify(x509.VerifyOptions{DNSName: "evil.example.com", Roots: roots}); err == nil {
		t.Error("member certificate valid for an unrelated name")
	}
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("CLI certificate: %v", err)
	}
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("the CLI certificate serves")
	}
	for _, f := range []string{"ca.key", "tls.key", "cli.key"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", f, err, st.Mode())
		}
	}
	if code, _, errs := runCLI(t, "certs", "init", "--dir", dir); code != 1 || !strings.Contains(errs, "exists; not overwritten") {
		t.Errorf("second init: exit %d %s", code, errs)
	}
}
