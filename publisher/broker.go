package publisher

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

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
	CAFile, CertFile, KeyFile string
	InsecureSkipVerify        bool
	// ReadTimeout, when set, replaces go-redis's 3 s: a publish pipeline
	// ending in WAIT must be allowed more than WAIT's timeout.
	ReadTimeout time.Duration
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
		return nil, fmt.Errorf("publisher: broker URL %s: %w", Redacted(raw), err)
	}
	tlsFromQuery, q, err := tlsParams(u.Query())
	if err != nil {
		return nil, err
	}
	u.RawQuery = q.Encode()
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("publisher: broker URL %s: %w", Redacted(raw), err)
	}
	if cfg.Password != "" {
		opts.Password = cfg.Password
	}
	if cfg.ReadTimeout > 0 {
		opts.ReadTimeout = cfg.ReadTimeout
	}
	if u.Scheme == "rediss" {
		if opts.TLSConfig, err = tlsConfig(cfg, tlsFromQuery, opts.TLSConfig); err != nil {
			return nil, err
		}
	}
	return redis.NewClient(opts), nil
}

// tlsParams takes Celery's ssl_* query parameters out of q, since go-redis
// rejects options it does not know.
func tlsParams(q url.Values) (BrokerConfig, url.Values, error) {
	var c BrokerConfig
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
				return c, q, fmt.Errorf("publisher: ssl_cert_reqs=%q: want required, optional or none", v)
			}
		default:
			continue
		}
		q.Del(k)
	}
	return c, q, nil
}

func tlsConfig(cfg, fromQuery BrokerConfig, base *tls.Config) (*tls.Config, error) {
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
			return nil, fmt.Errorf("publisher: broker CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("publisher: broker CA %s: no certificates", ca)
		}
		tc.RootCAs = pool
	}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("publisher: broker client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// newSentinel parses Celery's "sentinel://[:pass@]h1:26379[/db];sentinel://h2:26379".
func newSentinel(raw string, cfg BrokerConfig) (redis.UniversalClient, error) {
	if cfg.MasterName == "" {
		return nil, fmt.Errorf("publisher: a sentinel broker needs a master name (--broker-master-name)")
	}
	opts := &redis.FailoverOptions{MasterName: cfg.MasterName}
	for _, p := range strings.Split(raw, ";") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		u, err := url.Parse(p)
		if err != nil || u.Scheme != "sentinel" || u.Host == "" {
			return nil, fmt.Errorf("publisher: sentinel address %s: want sentinel://host:port", Redacted(p))
		}
		opts.SentinelAddrs = append(opts.SentinelAddrs, u.Host)
		if pw, ok := u.User.Password(); ok {
			opts.Password = pw
		}
		if db := strings.Trim(u.Path, "/"); db != "" {
			n, err := strconv.Atoi(db)
			if err != nil {
				return nil, fmt.Errorf("publisher: sentinel db %q is not a number", db)
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
		tc, err := tlsConfig(cfg, BrokerConfig{}, nil)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = tc
	}
	return redis.NewFailoverClient(opts), nil
}
