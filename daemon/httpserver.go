package daemon

import (
	"cmp"
	"log"
	"net/http"
	"time"
)

// DefaultHTTPAddr is --http's default: loopback, so a replica started
// without it serves its API and console to this host only. A deployment
// whose probes, Prometheus or other replicas reach it from elsewhere sets
// --http (the Kubernetes manifests and the image set :8080).
const DefaultHTTPAddr = "127.0.0.1:8080"

// HTTPTimeouts bound the HTTP servers' connections, so a slow or idle
// client cannot hold one (and its goroutine and buffers) for good. Zero
// fields take the defaults; tests shorten them.
type HTTPTimeouts struct {
	// ReadHeader is the time to read a request's headers.
	ReadHeader time.Duration
	// Read is the time to read a whole request, body included: the
	// entries API's largest body (api.MaxApplyBody) on a slow link.
	Read time.Duration
	// Write is the time from the end of a request's headers to the end of
	// its response. The console's live stream clears it (it is meant to
	// last), and a CPU profile or trace may ask for up to it.
	Write time.Duration
	// Idle is how long a kept-alive connection waits for its next request.
	Idle time.Duration
}

// The defaults of HTTPTimeouts.
const (
	DefaultHTTPReadHeaderTimeout = 5 * time.Second
	DefaultHTTPReadTimeout       = time.Minute
	DefaultHTTPWriteTimeout      = time.Minute
	DefaultHTTPIdleTimeout       = 2 * time.Minute
)

// newHTTPServer is an HTTP server for h with m's timeouts: the one place
// both listeners (--http, --metrics-http) are built.
func (m *Main) newHTTPServer(h http.Handler, errs *log.Logger) *http.Server {
	t := m.HTTPTimeouts
	return &http.Server{Handler: h, ErrorLog: errs,
		ReadHeaderTimeout: cmp.Or(t.ReadHeader, DefaultHTTPReadHeaderTimeout),
		ReadTimeout:       cmp.Or(t.Read, DefaultHTTPReadTimeout),
		WriteTimeout:      cmp.Or(t.Write, DefaultHTTPWriteTimeout),
		IdleTimeout:       cmp.Or(t.Idle, DefaultHTTPIdleTimeout),
	}
}
