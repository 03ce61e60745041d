package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/console"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/tlsfiles"
	"github.com/beatd/beatd/internal/version"
	"github.com/beatd/beatd/outcome"
)

// newConsole builds the web console served at / on this replica's HTTP
// server. Run history comes from the broker, where the publish script
// records it.
func (m *Main) newConsole() (*console.Server, error) {
	hc, err := m.replicaHTTP()
	if err != nil {
		return nil, err
	}
	return console.New(console.Config{HTTPClient: hc,
		Client: m.etcd, Prefix: m.Etcd.KeyPrefix(), ID: m.ID, Entries: m.runningConfig, Entry: m.entryOf, Runs: m.runHistory(),
		Broker:     broker.Redacted(m.Broker),
		PingBroker: m.brokerCheck,
		Term:       m.leader.Token, Timeline: m.timeline, LedShards: m.ledShards(), Tokens: m.tokens, AdminEnabled: m.tokens.Enabled(), Logger: m.log,
		Clock: m.clock,
	})
}

// shardObserver is shard i's Observer: its fires go to its own timeline,
// under its own term's token, as an unsharded leader's go to m.timeline.
func (m *Main) shardObserver(i int) func(entry string, slot time.Time, r broker.Result, lag time.Duration, manual bool) {
	tl := console.NewTimeline(m.clock.Now)
	for len(m.shardTimelines) <= i {
		m.shardTimelines = append(m.shardTimelines, nil)
	}
	m.shardTimelines[i] = tl
	return func(entry string, slot time.Time, r broker.Result, lag time.Duration, manual bool) {
		tl.Observe(m.shards.token(i), entry, slot, r, lag, manual)
		if m.console != nil {
			m.console.Changed()
		}
	}
}

// ledShards is the console's view of the shards this replica leads, with
// their timelines; nil on an unsharded replica.
func (m *Main) ledShards() func() []console.LedShard {
	if m.shards == nil {
		return nil
	}
	return func() []console.LedShard {
		var out []console.LedShard
		for _, l := range m.shards.leading() {
			out = append(out, console.LedShard{Shard: l.Shard, Term: l.Token, Elected: l.Elected, Timeline: m.shardTimelines[l.Shard]})
		}
		return out
	}
}

// runHistory is the publisher's run history in Redis, or nil with a
// broker that keeps none (RabbitMQ): never a nil *Publisher in the
// interface, which would read as a history.
func (m *Main) runHistory() outcome.History {
	if m.pub == nil {
		return nil
	}
	return m.pub
}

// observeFire feeds the console's timeline from the scheduler loop.
func (m *Main) observeFire(entry string, slot time.Time, r broker.Result, lag time.Duration, manual bool) {
	m.timeline.Observe(m.leader.Token(), entry, slot, r, lag, manual)
	if m.console != nil {
		m.console.Changed()
	}
}

// register keeps this replica's registration (address, health, term) in
// etcd until ctx ends.
func (m *Main) register(ctx context.Context) {
	cfg := election.RegistryConfig{Client: m.etcd, Prefix: m.Etcd.KeyPrefix(), TTL: m.LeaseTTL,
		Health: m.api.Ready, Broker: m.brokerHA.Err, Logger: m.log,
		Leading: m.leader.Term, Clock: m.clock}
	if m.shards != nil {
		cfg.Draining, cfg.Loading, cfg.Activity, cfg.Poke = m.shards.draining.Load, m.shards.loadingShards, m.shards.activity, m.shards.poke
	}
	election.Register(ctx, cfg,
		election.Replica{ID: m.ID, HTTP: m.advertisedURL(), Started: m.clock.Now().UTC(), Version: version.String()})
}

// advertisedURL is the one base URL other hosts reach this replica's HTTP
// at: --advertise-url, else http:// and the address advertised() picks.
// The registry (the console's leader link) and the catalog's status URL
// both use it.
func (m *Main) advertisedURL() string {
	if m.AdvertiseURL != "" {
		return strings.TrimSuffix(m.AdvertiseURL, "/")
	}
	scheme := "http://"
	if m.HTTPTLSCert != "" {
		scheme = "https://"
	}
	return scheme + advertised(m.httpLn.Addr().String(), m.Etcd.EndpointURLs())
}

// advertised is the address other replicas reach this one's HTTP server
// at: the listen address; when that is every interface (":8080"), the
// local IP this host uses to reach etcd (in Kubernetes, the pod IP), else
// the host name.
func advertised(listen string, etcd []string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return listen
	}
	for _, ep := range etcd {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			continue
		}
		// A UDP "connection" sends nothing; it only picks the route.
		if c, err := net.Dial("udp", u.Host); err == nil {
			local := c.LocalAddr().(*net.UDPAddr).IP
			c.Close()
			return net.JoinHostPort(local.String(), port)
		}
	}
	if h, err := os.Hostname(); err == nil {
		host = h
	}
	return net.JoinHostPort(host, port)
}

// replicaHTTP is the client this replica reads other replicas' HTTP with:
// it trusts --http-tls-ca when given (else the system's roots).
func (m *Main) replicaHTTP() (*http.Client, error) {
	if m.HTTPTLSCA == "" {
		return &http.Client{}, nil
	}
	pool, err := tlsfiles.Pool(m.HTTPTLSCA)
	if err != nil {
		return nil, fmt.Errorf("--http-tls-ca: %w", err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}}, nil
}
