package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/beatd/beatd/internal/retry"
	"github.com/beatd/beatd/internal/tlsfiles"
)

// dialBudget bounds the TCP dial of each etcd endpoint at start-up: an
// endpoint no dial reaches is named at once, without waiting out etcd's
// request budget.
const dialBudget = 500 * time.Millisecond

// setHandler makes h what the HTTP listener serves.
func (m *Main) setHandler(h http.Handler) { m.httpHandler.Store(&h) }

// setMetricsHandler makes h what --metrics-http serves.
func (m *Main) setMetricsHandler(h http.Handler) { m.metricsHandler.Store(&h) }

// httpErrorLog is net/http's log: its own messages (a failed TLS
// handshake: a port scan, a plain-HTTP probe) are noise at debug, in the
// log's format.
func (m *Main) httpErrorLog() *log.Logger {
	return slog.NewLogLogger(m.log.With("component", "http").Handler(), slog.LevelDebug)
}

// listenHTTP opens --http (and --metrics-http) and serves it, with
// startingHandler until Run swaps in the API: probes get an answer while
// beatd waits for etcd. m.wg owns the servers' goroutines; Close stops
// them.
func (m *Main) listenHTTP() error {
	var err error
	m.apiUp = make(chan struct{})
	if m.httpLn, err = net.Listen("tcp", m.HTTPAddr); err != nil {
		return fmt.Errorf("http: %w", err)
	}
	if m.MetricsHTTP != "" {
		ln, err := net.Listen("tcp", m.MetricsHTTP)
		if err != nil {
			_ = m.httpLn.Close()
			return fmt.Errorf("--metrics-http: %w", err)
		}
		m.setMetricsHandler(m.startingHandler(func() http.Handler { return *m.metricsHandler.Load() }))
		m.metricsSrv = m.newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			(*m.metricsHandler.Load()).ServeHTTP(w, r)
		}), m.httpErrorLog())
		srv := m.metricsSrv
		m.wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				m.log.Error("metrics http server", "err", err)
			}
		})
	}
	m.setHandler(m.startingHandler(func() http.Handler { return *m.httpHandler.Load() }))
	m.httpSrv = m.newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*m.httpHandler.Load()).ServeHTTP(w, r)
	}), m.httpErrorLog())
	if m.HTTPTLSCert != "" {
		r, err := tlsfiles.NewReloader(m.HTTPTLSCert, m.HTTPTLSKey, m.log.With("component", "http"), m.clock.Now)
		if err != nil {
			_ = m.httpLn.Close()
			m.httpSrv = nil // Close shuts the metrics server, if any
			return fmt.Errorf("--http-tls-cert: %w", err)
		}
		m.httpSrv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
	}
	srv, ln := m.httpSrv, m.httpLn
	m.wg.Go(func() {
		serve := func() error { return srv.Serve(ln) }
		if srv.TLSConfig != nil {
			serve = func() error { return srv.ServeTLS(ln, "", "") }
		}
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("http server", "err", err)
		}
	})
	return nil
}

// startWait is how long a request other than a probe waits for the API
// while the daemon starts, before it is answered 503.
const startWait = 10 * time.Second

// startingHandler answers while the daemon starts: /healthz 200 (the
// process lives and is not stuck), /readyz 503 with what it waits for.
// Any other request waits up to startWait for the API, which is moments
// away once etcd answers, and is then served by it: a client that saw
// /healthz answer is not refused for having come early.
func (m *Main) startingHandler(current func() http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	up := m.apiUp
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			t := m.clock.NewTimer(startWait)
			select {
			case <-up:
				t.Stop()
				current().ServeHTTP(w, r)
				return
			case <-r.Context().Done():
				t.Stop()
				return
			case <-t.Chan():
			}
		}
		why := "starting"
		if p := m.waitingFor.Load(); p != nil && *p != "" {
			why = "starting: " + *p
		}
		http.Error(w, why, http.StatusServiceUnavailable)
	})
	return mux
}

// waitEtcd probes etcd until it answers. An etcd that refuses beatd (a
// wrong certificate, a role without the prefix) fails the start; one that
// does not answer is waited for, retried with the one backoff, and logged
// as the running replica logs it (downLog): an ERROR naming each endpoint
// and why it failed, at once and every reminder. A pod whose etcd comes
// up late then starts instead of crash-looping; /readyz says why it is
// not ready meanwhile.
func (m *Main) waitEtcd(ctx context.Context) error {
	down := downLog{name: "etcd", where: m.Etcd.Endpoints}
	b := retry.Backoff(500*time.Millisecond, 5*time.Second)
	for {
		// No endpoint takes a TCP connection: unreachable, and the dials
		// say why, without a gRPC call that would wait out its budget.
		causes, dialed := dialEndpoints(ctx, m.Etcd.EndpointURLs())
		err := fmt.Errorf("%w: no endpoint takes a TCP connection", errEtcdUnreachable)
		if dialed {
			err = probeEtcd(ctx, m.etcd, &m.Etcd, probeBudget)
		}
		if err == nil {
			down.up(m.log, m.clock.Now())
			m.waitingFor.Store(nil)
			return nil
		}
		if !errors.Is(err, errEtcdUnreachable) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while waiting for etcd %s: %w", m.Etcd.Endpoints, ctx.Err())
		}
		if dialed {
			causes, _ = dialEndpoints(ctx, m.Etcd.EndpointURLs())
			for i, c := range causes {
				if !strings.Contains(c, ": dial ") {
					causes[i] = c + ": " + err.Error()
				}
			}
		}
		why := "waiting for etcd: " + strings.Join(causes, "; ")
		m.waitingFor.Store(&why)
		down.down(m.log, m.clock.Now(), err, "endpoints", causes, "starting", true)
		if !retry.Sleep(ctx, m.clock, b.NextBackOff()) {
			return fmt.Errorf("stopped while waiting for etcd %s: %w", m.Etcd.Endpoints, ctx.Err())
		}
	}
}

// dialEndpoints dials each endpoint's host:port and names it with the
// dial's error (connection refused, no such host, a timeout), or alone if
// it took the connection; dialed reports whether any did.
func dialEndpoints(ctx context.Context, endpoints []string) (causes []string, dialed bool) {
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			causes, dialed = append(causes, ep), true // etcd's client says what it makes of it
			continue
		}
		d := net.Dialer{Timeout: dialBudget}
		c, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			causes = append(causes, fmt.Sprintf("%s: %v", ep, err))
			continue
		}
		_ = c.Close()
		causes, dialed = append(causes, ep), true
	}
	return causes, dialed
}
