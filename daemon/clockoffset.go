package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// clockOffset estimates this replica's wall clock against etcd's. A slot
// is due by the leader's wall clock: a leader 30 s fast fires 30 s early,
// and the lease (monotonic) says nothing about it.
//
// etcd's client port answers HTTP too, and every answer carries a Date
// header, to the second. One probe bounds the offset: etcd's clock read
// somewhere between the request's send (t0) and its answer (t1), and showed
// D, so its time then was in [D, D+1s) and the offset is in
// [D - t1, D + 1s - t0]. Probes at other fractions of a second cut that
// interval, and the intersection of the last few narrows it to about the
// round trip: no NTP needed on the path, only HTTP.
type clockOffset struct {
	clock    clockwork.Clock
	http     *http.Client
	urls     []string
	warnPast time.Duration
	log      *slog.Logger
	gauge    prometheus.Gauge

	mu      sync.Mutex
	samples []offsetBounds // newest last, at most offsetSamples
	err     error
	warned  time.Time
}

type offsetBounds struct{ lo, hi time.Duration }

// offsetSamples is how many probes the estimate intersects; offsetEvery
// how often a probe runs once the first burst is done.
const (
	offsetSamples = 8
	offsetEvery   = 15 * time.Second
)

func newClockOffset(clock clockwork.Clock, endpoints []string, tc *tls.Config, warnPast time.Duration, log *slog.Logger) *clockOffset {
	var urls []string
	for _, e := range endpoints {
		if !strings.Contains(e, "://") {
			e = "http://" + e
		}
		urls = append(urls, strings.TrimSuffix(e, "/")+"/version")
	}
	return &clockOffset{clock: clock, urls: urls, warnPast: warnPast, log: log,
		// No keep-alive: a probe every 15 s needs no open connection, and
		// an idle one held the embedded etcd's Close (it waits for its
		// client connections) for minutes.
		http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}},
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_clock_offset_seconds",
			Help: "This replica's wall clock minus etcd's, estimated from etcd's HTTP Date headers (positive: this replica is ahead)."})}
}

// run probes until ctx ends: a burst at start, spread over the fractions
// of a second, then every offsetEvery.
func (c *clockOffset) run(ctx context.Context) {
	defer c.http.CloseIdleConnections()
	for i := 0; ctx.Err() == nil; i++ {
		c.probe(ctx)
		wait := offsetEvery
		if i < offsetSamples {
			wait = 1130 * time.Millisecond // not a whole second: each lands at another fraction
		}
		t := c.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}

func (c *clockOffset) probe(ctx context.Context) {
	var err error
	for _, u := range c.urls {
		var b offsetBounds
		if b, err = c.sample(ctx, u); err == nil {
			c.add(b)
			return
		}
	}
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

func (c *clockOffset) sample(ctx context.Context, url string) (offsetBounds, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return offsetBounds{}, err
	}
	t0 := c.clock.Now()
	resp, err := c.http.Do(req)
	t1 := c.clock.Now()
	if err != nil {
		return offsetBounds{}, fmt.Errorf("clock offset: %w", err)
	}
	resp.Body.Close()
	d, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return offsetBounds{}, fmt.Errorf("clock offset: %s sent no Date header: %w", url, err)
	}
	// offset = local - etcd: local in [t0, t1], etcd in [d, d+1s).
	return offsetBounds{lo: t0.Sub(d.Add(time.Second)), hi: t1.Sub(d)}, nil
}

// add records a probe's bounds and warns when the offset is past the
// threshold for sure (by more than its uncertainty).
func (c *clockOffset) add(b offsetBounds) {
	c.mu.Lock()
	c.err = nil
	c.samples = append(c.samples, b)
	if len(c.samples) > offsetSamples {
		c.samples = c.samples[1:]
	}
	est, unc, ok := c.estimateLocked()
	now := c.clock.Now()
	warn := ok && c.warnPast > 0 && absDuration(est)-unc > c.warnPast && now.Sub(c.warned) >= 5*time.Minute
	if warn {
		c.warned = now
	}
	c.mu.Unlock()
	if ok {
		c.gauge.Set(est.Seconds())
	}
	if warn {
		c.log.Warn("this replica's clock is off etcd's: slots fire by the leader's wall clock, so they are off by as much; fix NTP on this host",
			"offset", est.Round(time.Millisecond).String(), "uncertainty", unc.Round(time.Millisecond).String(), "warn_past", c.warnPast.String())
	}
}

// estimateLocked intersects the newest samples that agree: a clock step
// makes old samples disagree with new ones, and then only the new count.
func (c *clockOffset) estimateLocked() (est, unc time.Duration, ok bool) {
	if len(c.samples) == 0 {
		return 0, 0, false
	}
	lo, hi := c.samples[len(c.samples)-1].lo, c.samples[len(c.samples)-1].hi
	for i := len(c.samples) - 2; i >= 0; i-- {
		s := c.samples[i]
		nlo, nhi := max(lo, s.lo), min(hi, s.hi)
		if nlo > nhi {
			break
		}
		lo, hi = nlo, nhi
	}
	return (lo + hi) / 2, (hi - lo) / 2, true
}

// ClockStatus is what /status shows of the estimate.
type ClockStatus struct {
	OffsetSeconds      *float64
	UncertaintySeconds float64
	Warning            string
}

func (c *clockOffset) status() ClockStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	est, unc, ok := c.estimateLocked()
	var out ClockStatus
	if !ok {
		if c.err != nil {
			out.Warning = "clock offset unknown: " + c.err.Error()
		}
		return out
	}
	s := est.Seconds()
	out.OffsetSeconds, out.UncertaintySeconds = &s, unc.Seconds()
	if c.warnPast > 0 && absDuration(est)-unc > c.warnPast {
		out.Warning = fmt.Sprintf("this replica's clock is %s off etcd's (±%s), past %s: slots fire by the leader's wall clock; fix NTP on this host",
			est.Round(time.Millisecond), unc.Round(time.Millisecond), c.warnPast)
	}
	return out
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
