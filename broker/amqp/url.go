package amqp

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/broker"
	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPURL is one Celery AMQP broker URL, parsed as Kombu parses it.
type AMQPURL struct {
	Host     string
	Port     int
	User     string
	Password string
	VHost    string
	// TLS is set for amqps:// (and for ssl=true); nil for plain TCP.
	TLS *tls.Config
	// Heartbeat is the AMQP heartbeat interval beatd asks for. A broker
	// closes a connection after two missed heartbeats, which bounds how
	// long a paused leader's connection (and its fence lock) outlives it.
	Heartbeat      time.Duration
	ConnectTimeout time.Duration
}

// Addr is host:port.
func (u AMQPURL) Addr() string { return net.JoinHostPort(u.Host, strconv.Itoa(u.Port)) }

// String is the URL without the password, safe to log.
func (u AMQPURL) String() string {
	scheme := "amqp"
	if u.TLS != nil {
		scheme = "amqps"
	}
	return fmt.Sprintf("%s://%s@%s/%s", scheme, u.User, u.Addr(), url.PathEscape(u.VHost))
}

// Dial connects to u, within timeout (0: u.ConnectTimeout), naming the
// connection name in RabbitMQ's management views. Every connection beatd
// makes to RabbitMQ goes through it, so TLS and heartbeats are set once.
func (u AMQPURL) Dial(name string, timeout time.Duration) (*amqp.Connection, error) {
	if timeout <= 0 {
		timeout = u.ConnectTimeout
	}
	uri := amqp.URI{Scheme: "amqp", Host: u.Host, Port: u.Port, Username: u.User, Password: u.Password, Vhost: u.VHost}
	cfg := amqp.Config{Heartbeat: u.Heartbeat, Dial: amqp.DefaultDial(timeout), Vhost: u.VHost,
		Properties: amqp.Table{"connection_name": name}}
	if u.TLS != nil {
		uri.Scheme = "amqps"
		cfg.TLSClientConfig = u.TLS
	}
	return amqp.DialConfig(uri.String(), cfg)
}

// amqpSchemes are the transports Celery reaches RabbitMQ with; beatd
// speaks AMQP 0-9-1 itself, so they are the same broker to it.
var amqpSchemes = map[string]bool{"amqp": false, "amqps": true, "pyamqp": false, "pyamqps": true, "librabbitmq": false}

// DefaultAMQPHeartbeat is the heartbeat unless the URL sets one.
const DefaultAMQPHeartbeat = 2 * time.Second

// IsAMQPURL reports whether raw is a RabbitMQ broker URL (amqp://,
// amqps://, pyamqp://, librabbitmq://), as opposed to a Redis one.
func IsAMQPURL(raw string) bool {
	first, _, _ := strings.Cut(strings.TrimSpace(raw), ";")
	scheme, _, ok := strings.Cut(first, "://")
	_, known := amqpSchemes[strings.ToLower(scheme)]
	return ok && known
}

// ParseAMQPURLs parses Celery's broker URL: one URL, or several separated
// by ";" for failover, tried in order.
func ParseAMQPURLs(raw, password string) ([]AMQPURL, error) {
	var out []AMQPURL
	for _, p := range strings.Split(raw, ";") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		u, err := ParseAMQPURL(p, password)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("amqp: empty AMQP broker URL")
	}
	return out, nil
}

// ParseAMQPURL parses one URL, with Kombu's defaults: user and password
// guest, host localhost, port 5672 (5671 with TLS), virtual host "/" (the
// path is the vhost, URL-escaped: "amqp://h//" and "amqp://h/%2F" are "/").
// password, when set, overrides the URL's. Query parameters: heartbeat
// (seconds, 0 for the broker's), connect_timeout (seconds), ssl (true for
// TLS on amqp://) and ssl_ca_certs, ssl_certfile, ssl_keyfile,
// ssl_cert_reqs (required, optional or none).
func ParseAMQPURL(raw, password string) (AMQPURL, error) {
	bad := func(format string, args ...any) (AMQPURL, error) {
		return AMQPURL{}, fmt.Errorf("amqp: broker URL %s: %s", broker.Redacted(raw), fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("%v", errWithoutURL(err))
	}
	useTLS, ok := amqpSchemes[strings.ToLower(u.Scheme)]
	if !ok {
		return bad("scheme %q is not an AMQP scheme (want amqp, amqps, pyamqp or librabbitmq)", u.Scheme)
	}
	if u.Opaque != "" {
		return bad("want %s://[user:password@]host[:port]/vhost", u.Scheme)
	}
	out := AMQPURL{Host: u.Hostname(), User: "guest", Password: "guest", VHost: "/",
		Heartbeat: DefaultAMQPHeartbeat, ConnectTimeout: 5 * time.Second}
	if out.Host == "" {
		out.Host = "localhost"
	}
	if u.User != nil {
		if n := u.User.Username(); n != "" {
			out.User = n
		}
		if p, ok := u.User.Password(); ok {
			out.Password = p
		}
	}
	if password != "" {
		out.Password = password
	}
	if len(u.Path) > 1 {
		out.VHost = u.Path[1:]
	}
	q := u.Query()
	var files broker.TLSFiles
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case "heartbeat":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				return bad("heartbeat=%q: want seconds, 0 or more", v)
			}
			out.Heartbeat = time.Duration(f * float64(time.Second))
		case "connect_timeout":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				return bad("connect_timeout=%q: want seconds, more than 0", v)
			}
			out.ConnectTimeout = time.Duration(f * float64(time.Second))
		case "ssl":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return bad("ssl=%q: want true or false", v)
			}
			useTLS = useTLS || b
		case "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs":
			useTLS = true
		default:
			return bad("unknown parameter %q (known: heartbeat, connect_timeout, ssl, ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs)", k)
		}
	}
	files, _, err = broker.TLSParams(q)
	if err != nil {
		return bad("%v", err)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return bad("port %q is not a port number", p)
		}
		out.Port = n
	} else if useTLS {
		out.Port = 5671
	} else {
		out.Port = 5672
	}
	if useTLS {
		if out.TLS, err = broker.TLSConfig(broker.TLSFiles{}, files, nil); err != nil {
			return AMQPURL{}, err
		}
		if out.TLS.ServerName == "" {
			out.TLS.ServerName = out.Host
		}
	}
	return out, nil
}

// errWithoutURL drops the URL (and its password) from url.Parse's error.
func errWithoutURL(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// EventsDialer is how outcome.RunAMQPEvents reaches the broker raw names
// (Celery's URL, with failover URLs separated by ";"): its attempt'th
// connection goes to the next URL in turn, named for replica in
// RabbitMQ's management views.
func EventsDialer(raw, password, replica string) (func(attempt int) (*amqp.Connection, error), error) {
	urls, err := ParseAMQPURLs(raw, password)
	if err != nil {
		return nil, err
	}
	return func(attempt int) (*amqp.Connection, error) {
		u := urls[attempt%len(urls)]
		conn, err := u.Dial("beatd events "+replica, 0)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u, err)
		}
		return conn, nil
	}, nil
}
