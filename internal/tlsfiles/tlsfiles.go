// Package tlsfiles checks the TLS material beatd is given, so a bad one
// is one clear error at start: the certificate, key and CA files (naming
// the file), and a server's refusal of them (RefusedHandshake). It also
// serves a certificate that is read again when its files change
// (cert-manager rotates them in place).
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CheckPair loads a certificate and its key and checks that they match
// and that the certificate is valid at now.
func CheckPair(certFile, keyFile string, now time.Time) (*tls.Certificate, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "":
		return nil, fmt.Errorf("key %s has no certificate: give its certificate file too", keyFile)
	case keyFile == "":
		return nil, fmt.Errorf("certificate %s has no key: give its key file too", certFile)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", certFile, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", keyFile, err)
	}
	if b, _ := pem.Decode(certPEM); b == nil {
		return nil, fmt.Errorf("certificate %s: not PEM", certFile)
	}
	if b, _ := pem.Decode(keyPEM); b == nil {
		return nil, fmt.Errorf("key %s: not PEM", keyFile)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate %s with key %s: %w", certFile, keyFile, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate %s: %w", certFile, err)
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		return nil, fmt.Errorf("certificate %s expired at %s", certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("certificate %s is not valid before %s", certFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return &pair, nil
}

// CheckCA checks that a CA file holds at least one PEM certificate.
func CheckCA(caFile string) error {
	if caFile == "" {
		return nil
	}
	_, err := Pool(caFile)
	return err
}

// Pool reads a CA bundle; an error names the file.
func Pool(caFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", caFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA %s: no PEM certificate in it", caFile)
	}
	return pool, nil
}

// Check checks a certificate, its key and a CA, in that order.
func Check(certFile, keyFile, caFile string, now time.Time) error {
	if _, err := CheckPair(certFile, keyFile, now); err != nil {
		return err
	}
	return CheckCA(caFile)
}

// Reloader serves a certificate from its files, read again when they
// change (looked at no more than once a second). A change that does not
// load keeps the certificate in use, and is logged.
type Reloader struct {
	cert, key string
	log       *slog.Logger
	now       func() time.Time

	mu        sync.Mutex
	pair      *tls.Certificate
	stamp     [2]stamp
	checkedAt time.Time
}

type stamp struct {
	mod  time.Time
	size int64
}

// NewReloader loads the pair; an error names the file at fault.
func NewReloader(certFile, keyFile string, log *slog.Logger, now func() time.Time) (*Reloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tlsfiles: a certificate and its key are both required")
	}
	r := &Reloader{cert: certFile, key: keyFile, log: log, now: now}
	pair, err := CheckPair(certFile, keyFile, now())
	if err != nil {
		return nil, err
	}
	r.pair, r.stamp, r.checkedAt = pair, r.stamps(), now()
	return r, nil
}

func (r *Reloader) stamps() (s [2]stamp) {
	for i, f := range []string{r.cert, r.key} {
		if st, err := os.Stat(f); err == nil {
			s[i] = stamp{st.ModTime(), st.Size()}
		}
	}
	return s
}

// GetCertificate is tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if d := now.Sub(r.checkedAt); d >= time.Second || d < 0 {
		r.checkedAt = now
		if st := r.stamps(); st != r.stamp {
			// Both files may be mid-rotation: a pair that does not load
			// now is tried again at the next look.
			pair, err := CheckPair(r.cert, r.key, now)
			if err != nil {
				r.log.Warn("TLS certificate changed but does not load; serving the previous one", "err", err)
			} else {
				r.pair, r.stamp = pair, st
				r.log.Info("TLS certificate reloaded", "cert", r.cert, "not_after", pair.Leaf.NotAfter.UTC().Format(time.RFC3339))
			}
		}
	}
	return r.pair, nil
}

// RefusedHandshake dials addr ("host:port") with tc and returns the TLS
// error if the server refuses this client (its certificate, or the lack
// of one) or this client refuses the server's certificate. It returns nil
// if the handshake is accepted or the server cannot be reached at all,
// which may heal.
//
// It exists because a client library sees a refused client certificate
// only by chance: with TLS 1.3 the server judges the client's certificate
// after the client's side of the handshake is done, and says so in an
// alert. A client that writes its first command first gets a reset
// connection, which reads as "down". This one writes nothing and reads
// the alert, waiting at most wait for it.
func RefusedHandshake(addr string, tc *tls.Config, wait time.Duration) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	tc = tc.Clone()
	if tc.ServerName == "" {
		tc.ServerName = host
	}
	d := &net.Dialer{Timeout: 3 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, tc)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
			return nil
		}
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil && strings.Contains(err.Error(), "tls:") {
		return err
	}
	return nil
}
