package redis

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/redis/go-redis/v9"
)

// BrokerConfig says how to reach Redis. URL is a Celery broker URL:
//
//	redis://[user:pass@]host:port/db
//	rediss://host:port/db?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem&ssl_certfile=..&ssl_keyfile=..
//	unix:///path/redis.sock?db=0   (also redis+socket:///path)
//	sentinel://h1:26379;sentinel://h2:26379   with MasterName
type BrokerConfig struct {
	URL        string
	MasterName string // sentinel only
	// Password overrides the URL's password; typically read from an env
	// var or a file by the caller, so it never sits in a command line.
	Password string
	// TLS files, for rediss:// or sentinel over TLS (they override the URL's
	// ssl_* query parameters).
	broker.TLSFiles
	// ReadTimeout, when set, replaces go-redis's 3 s: a publish pipeline
	// ending in WAIT must be allowed more than WAIT's timeout.
	ReadTimeout time.Duration
}

// protocol is the RESP version beatd speaks, unless a URL's protocol=
// says otherwise: RESP2, as Kombu does. beatd reads nothing that needs
// RESP3, and over RESP3 go-redis looks for a push notification before
// every reply it reads: a fire's share of a flight's replies cost ~3 % of
// a 20,000-entry burst's CPU (docs/performance.md).
const protocol = 2

// NewClient opens a client for cfg. It does not dial: go-redis connects
// lazily and reconnects on its own.
func NewClient(cfg BrokerConfig) (redis.UniversalClient, error) {
	raw := strings.TrimSpace(cfg.URL)
	if raw == "" {
		raw = "redis://127.0.0.1:6379/0"
	}
	if strings.HasPrefix(raw, "sentinel://") {
		return newSentinel(raw, cfg)
	}
	if rest, ok := strings.CutPrefix(raw, "redis+socket://"); ok {
		raw = "unix://" + rest
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("redis: broker URL %s: %w", broker.Redacted(raw), err)
	}
	tlsFromQuery, q, err := broker.TLSParams(u.Query())
	if err != nil {
		return nil, err
	}
	u.RawQuery = q.Encode()
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("redis: broker URL %s: %w", broker.Redacted(raw), err)
	}
	if cfg.Password != "" {
		opts.Password = cfg.Password
	}
	if cfg.ReadTimeout > 0 {
		opts.ReadTimeout = cfg.ReadTimeout
	}
	if u.Scheme == "rediss" {
		if opts.TLSConfig, err = broker.TLSConfig(cfg.TLSFiles, tlsFromQuery, opts.TLSConfig); err != nil {
			return nil, err
		}
	}
	// A term that ends by its context (a handover for a cut broker path,
	// SIGTERM) must not wait out the read timeout on a dead connection.
	// What a cancelled publish did reach Redis dedups on the next leader.
	opts.ContextTimeoutEnabled = true
	if !q.Has("protocol") {
		opts.Protocol = protocol
	}
	return redis.NewClient(opts), nil
}

// newSentinel parses Celery's "sentinel://[:pass@]h1:26379[/db];sentinel://h2:26379".
func newSentinel(raw string, cfg BrokerConfig) (redis.UniversalClient, error) {
	if cfg.MasterName == "" {
		return nil, fmt.Errorf("redis: a sentinel broker needs a master name (--broker-master-name)")
	}
	opts := &redis.FailoverOptions{MasterName: cfg.MasterName}
	for _, p := range strings.Split(raw, ";") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		u, err := url.Parse(p)
		if err != nil || u.Scheme != "sentinel" || u.Host == "" {
			return nil, fmt.Errorf("redis: sentinel address %s: want sentinel://host:port", broker.Redacted(p))
		}
		opts.SentinelAddrs = append(opts.SentinelAddrs, u.Host)
		if pw, ok := u.User.Password(); ok {
			opts.Password = pw
		}
		if db := strings.Trim(u.Path, "/"); db != "" {
			n, err := strconv.Atoi(db)
			if err != nil {
				return nil, fmt.Errorf("redis: sentinel db %q is not a number", db)
			}
			opts.DB = n
		}
	}
	if cfg.Password != "" {
		opts.Password = cfg.Password
	}
	if cfg.ReadTimeout > 0 {
		opts.ReadTimeout = cfg.ReadTimeout
	}
	if cfg.CAFile != "" || cfg.CertFile != "" {
		tc, err := broker.TLSConfig(cfg.TLSFiles, broker.TLSFiles{}, nil)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = tc
	}
	opts.ContextTimeoutEnabled = true // as for a plain client
	opts.Protocol = protocol
	return redis.NewFailoverClient(opts), nil
}
