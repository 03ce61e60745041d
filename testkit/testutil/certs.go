package testutil

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/beatd/beatd/internal/certgen"
)

// Certs are PEM files of a throwaway PKI (internal/certgen): a CA, a
// server certificate for 127.0.0.1 and localhost, client certificates,
// and an unrelated CA that signed nothing here (the "wrong CA").
type Certs struct {
	Dir        string
	CA, CAKey  string
	ServerCert string
	ServerKey  string
	WrongCA    string
	ca         *certgen.CA
}

// WriteCerts writes a CA, a server certificate and a wrong CA into dir.
func WriteCerts(dir string) (*Certs, error) {
	c := &Certs{Dir: dir}
	var err error
	if c.ca, err = certgen.NewCA("beatd test CA", time.Now(), 24*time.Hour); err != nil {
		return nil, err
	}
	c.CA = filepath.Join(dir, "ca.pem")
	c.CAKey = filepath.Join(dir, "ca-key.pem")
	if err := certgen.WriteFile(c.CA, c.ca.CertPEM()); err != nil {
		return nil, err
	}
	key, err := c.ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := certgen.WriteFile(c.CAKey, key); err != nil {
		return nil, err
	}
	c.ServerCert, c.ServerKey, err = c.Issue("server", "127.0.0.1", true)
	if err != nil {
		return nil, err
	}
	wrong, err := certgen.NewCA("some other CA", time.Now(), 24*time.Hour)
	if err != nil {
		return nil, err
	}
	c.WrongCA = filepath.Join(dir, "wrong-ca.pem")
	if err := certgen.WriteFile(c.WrongCA, wrong.CertPEM()); err != nil {
		return nil, err
	}
	return c, nil
}

// Issue signs a client certificate with common name cn (for a server,
// also a server certificate valid for 127.0.0.1 and localhost) and
// returns its certificate and key files.
func (c *Certs) Issue(name, cn string, server bool) (cert, key string, err error) {
	spec := certgen.Spec{CN: cn, Client: true, Server: server, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	if server {
		spec.IPs, spec.DNS = []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"}
	}
	certPEM, keyPEM, err := c.ca.Issue(spec)
	if err != nil {
		return "", "", fmt.Errorf("sign %s: %w", name, err)
	}
	cert = filepath.Join(c.Dir, name+".pem")
	key = filepath.Join(c.Dir, name+"-key.pem")
	if err := certgen.WriteFile(cert, certPEM); err != nil {
		return "", "", err
	}
	return cert, key, certgen.WriteFile(key, keyPEM)
}

// ClientTLS is a tls.Config that trusts the CA, for test clients.
func (c *Certs) ClientTLS() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.ca.Cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// ClientTLSWithCert is ClientTLS presenting the certificate in files.
func (c *Certs) ClientTLSWithCert(cert, key string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	tc := c.ClientTLS()
	tc.Certificates = []tls.Certificate{pair}
	return tc, nil
}
