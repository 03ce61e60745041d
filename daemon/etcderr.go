package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// Where names the etcd endpoints a command dials, for messages.
func (f *EtcdFlags) Where() string {
	eps := f.EndpointURLs()
	if len(eps) == 0 {
		eps = []string{defaultEtcdEndpoint}
	}
	return strings.Join(eps, ",")
}

// defaultEtcdEndpoint is where CLI commands look for etcd without
// --etcd-endpoints: the embedded etcd of `beatd run` on its default port.
const defaultEtcdEndpoint = "http://127.0.0.1:2379"

// Failure says which etcd a CLI command could not use and why, with
// the flag that points it elsewhere.
func (f *EtcdFlags) Failure(what string, timeout time.Duration, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		if why := f.tlsRefusal(); why != "" {
			return fmt.Errorf("%s: etcd at %s refused this client: %s (does --etcd-cert hold a client certificate signed by the members' CA, and --etcd-cacert hold that CA?)",
				what, f.Where(), why)
		}
		return fmt.Errorf("%s: etcd at %s did not answer within %s (is etcd running there? set --etcd-endpoints or BEATD_ETCD_ENDPOINTS): %w",
			what, f.Where(), timeout, err)
	}
	return fmt.Errorf("%s: etcd at %s: %w", what, f.Where(), err)
}

// tlsRefusal says why the first https endpoint's TLS refuses this client
// ("" when it does not, or none is https). etcd's client retries a
// refused handshake until its deadline and then reports only that, so a
// missing or foreign client certificate would read as "did not answer".
// With TLS 1.3 a server's refusal of the client's certificate arrives
// after the handshake, so the probe reads once too.
func (f *EtcdFlags) tlsRefusal() string {
	var host string
	for _, ep := range f.EndpointURLs() {
		if u, err := url.Parse(ep); err == nil && u.Scheme == "https" {
			host = u.Host
			break
		}
	}
	if host == "" {
		return ""
	}
	tc, err := f.TLSConfig()
	if err != nil {
		return err.Error()
	}
	if tc == nil {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tc = tc.Clone()
	tc.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", host, tc)
	if err != nil {
		if m := err.Error(); strings.Contains(m, "tls:") || strings.Contains(m, "x509:") {
			return m
		}
		return "" // unreachable, not refused: the caller says so
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(time.Second)) // a socket deadline: the OS's time
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil && strings.Contains(err.Error(), "remote error: tls") {
		return err.Error()
	}
	return ""
}
