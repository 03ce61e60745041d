package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Certs are PEM files of a throwaway PKI made with crypto/x509: a CA, a
// server certificate for 127.0.0.1 and localhost, client certificates, and
// an unrelated CA that signed nothing here (the "wrong CA").
type Certs struct {
	Dir        string
	CA, CAKey  string
	ServerCert string
	ServerKey  string
	WrongCA    string
	ca         *x509.Certificate
	caKey      *ecdsa.PrivateKey
}

// WriteCerts writes a CA, a server certificate and a wrong CA into dir.
func WriteCerts(dir string) (*Certs, error) {
	c := &Certs{Dir: dir}
	var err error
	c.ca, c.caKey, err = newCA("beatd test CA")
	if err != nil {
		return nil, err
	}
	c.CA = filepath.Join(dir, "ca.pem")
	c.CAKey = filepath.Join(dir, "ca-key.pem")
	if err := writePEM(c.CA, "CERTIFICATE", c.ca.Raw); err != nil {
		return nil, err
	}
	if err := writeKey(c.CAKey, c.caKey); err != nil {
		return nil, err
	}
	c.ServerCert, c.ServerKey, err = c.Issue("server", "127.0.0.1", true)
	if err != nil {
		return nil, err
	}
	wrong, _, err := newCA("some other CA")
	if err != nil {
		return nil, err
	}
	c.WrongCA = filepath.Join(dir, "wrong-ca.pem")
	if err := writePEM(c.WrongCA, "CERTIFICATE", wrong.Raw); err != nil {
		return nil, err
	}
	return c, nil
}

// Issue signs a certificate with common name cn (for a server, also valid
// for 127.0.0.1 and localhost) and returns its certificate and key files.
func (c *Certs) Issue(name, cn string, server bool) (cert, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &k.PublicKey, c.caKey)
	if err != nil {
		return "", "", fmt.Errorf("sign %s: %w", name, err)
	}
	cert = filepath.Join(c.Dir, name+".pem")
	key = filepath.Join(c.Dir, name+"-key.pem")
	if err := writePEM(cert, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return cert, key, writeKey(key, k)
}

// ClientTLS is a tls.Config that trusts the CA, for test clients.
func (c *Certs) ClientTLS() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.ca)
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

func newCA(cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, k, err
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func writeKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}
