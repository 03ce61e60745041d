package broker

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// TLSFiles are a broker connection's TLS settings, as Celery's broker URL
// query (ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs) or flags
// give them.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
	InsecureSkipVerify        bool
}

// Redacted returns the URL with any password replaced, safe to log.
func Redacted(raw string) string {
	parts := strings.Split(raw, ";")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil {
			parts[i] = u.Redacted()
		} else {
			parts[i] = "<unparseable broker URL>"
		}
	}
	return strings.Join(parts, ";")
}

// TLSParams takes Celery's ssl_* query parameters out of q, since go-redis
// rejects options it does not know.
func TLSParams(q url.Values) (TLSFiles, url.Values, error) {
	var c TLSFiles
	for k, vs := range q {
		v := vs[0]
		switch k {
		case "ssl_ca_certs":
			c.CAFile = v
		case "ssl_certfile":
			c.CertFile = v
		case "ssl_keyfile":
			c.KeyFile = v
		case "ssl_cert_reqs":
			switch strings.ToLower(strings.TrimPrefix(v, "CERT_")) {
			case "none":
				c.InsecureSkipVerify = true
			case "required", "optional":
			default:
				return c, q, fmt.Errorf("broker: ssl_cert_reqs=%q: want required, optional or none", v)
			}
		default:
			continue
		}
		q.Del(k)
	}
	return c, q, nil
}

// TLSConfig builds the client TLS config: cfg's files over fromQuery's,
// on top of base (nil: a fresh one, TLS 1.2 at least).
func TLSConfig(cfg, fromQuery TLSFiles, base *tls.Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if base != nil {
		tc = base.Clone()
	}
	pick := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	ca, cert, key := pick(cfg.CAFile, fromQuery.CAFile), pick(cfg.CertFile, fromQuery.CertFile), pick(cfg.KeyFile, fromQuery.KeyFile)
	tc.InsecureSkipVerify = cfg.InsecureSkipVerify || fromQuery.InsecureSkipVerify
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("broker: broker CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker: broker CA %s: no certificates", ca)
		}
		tc.RootCAs = pool
	}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("broker: broker client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}
