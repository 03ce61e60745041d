package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/certgen"
)

// TestRefusedHandshake runs the handshake against a TLS 1.3 server that,
// like Redis with tls-auth-clients yes, requires a client certificate and
// then waits for the client to speak first.
func TestRefusedHandshake(t *testing.T) {
	now := time.Now()
	ca, err := certgen.NewCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := certgen.NewCA("other", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair := func(ca *certgen.CA, spec certgen.Spec) tls.Certificate {
		spec.NotBefore, spec.NotAfter = now.Add(-time.Minute), now.Add(time.Hour)
		c, k, err := ca.Issue(spec)
		if err != nil {
			t.Fatal(err)
		}
		p, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair(ca, certgen.Spec{CN: "server", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var b [1]byte
				_, _ = c.Read(b[:]) // the handshake, then a wait for the client
			}()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	client := pair(ca, certgen.Spec{CN: "beatd", Client: true})
	for _, tc := range []struct {
		name string
		addr string
		cfg  *tls.Config
		want string // "" for nil
	}{
		{"client certificate accepted", ln.Addr().String(), &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{client}}, ""},
		{"no client certificate", ln.Addr().String(), &tls.Config{RootCAs: pool}, "tls: certificate required"},
		{"client certificate from another CA", ln.Addr().String(),
			&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair(other, certgen.Spec{CN: "beatd", Client: true})}}, "tls: "},
		{"server certificate from another CA", ln.Addr().String(), &tls.Config{Certificates: []tls.Certificate{client}}, "x509: "},
		{"nothing listening", closedAddr, &tls.Config{RootCAs: pool}, ""},
		{"not an address", "127.0.0.1", &tls.Config{RootCAs: pool}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := RefusedHandshake(tc.addr, tc.cfg, 300*time.Millisecond)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
