package amqp

import (
	"strings"
	"testing"
	"time"
)

func TestParseAMQPURL(t *testing.T) {
	tests := []struct {
		url, password     string
		host              string
		port              int
		user, pass, vhost string
		tls               bool
		heartbeat         time.Duration
		err               string
	}{
		{url: "amqp://", host: "localhost", port: 5672, user: "guest", pass: "guest", vhost: "/", heartbeat: DefaultAMQPHeartbeat},
		{url: "amqp://guest@localhost//", host: "localhost", port: 5672, user: "guest", pass: "guest", vhost: "/", heartbeat: DefaultAMQPHeartbeat},
		{url: "amqp://user:pa%40ss@rabbit:5673/prod", host: "rabbit", port: 5673, user: "user", pass: "pa@ss", vhost: "prod", heartbeat: DefaultAMQPHeartbeat},
		{url: "amqp://h/%2F", host: "h", port: 5672, user: "guest", pass: "guest", vhost: "/", heartbeat: DefaultAMQPHeartbeat},
		{url: "amqp://h/", host: "h", port: 5672, user: "guest", pass: "guest", vhost: "/", heartbeat: DefaultAMQPHeartbeat},
		{url: "pyamqp://u:p@h:1234/v?heartbeat=10", host: "h", port: 1234, user: "u", pass: "p", vhost: "v", heartbeat: 10 * time.Second},
		{url: "librabbitmq://u:p@h/v", host: "h", port: 5672, user: "u", pass: "p", vhost: "v", heartbeat: DefaultAMQPHeartbeat},
		{url: "amqps://u:p@h/v", host: "h", port: 5671, user: "u", pass: "p", vhost: "v", tls: true, heartbeat: DefaultAMQPHeartbeat},
		{url: "amqps://h:5999/v?ssl_cert_reqs=none", host: "h", port: 5999, user: "guest", pass: "guest", vhost: "v", tls: true, heartbeat: DefaultAMQPHeartbeat},
		{url: "amqp://h/v?ssl=true", host: "h", port: 5671, user: "guest", pass: "guest", vhost: "v", tls: true, heartbeat: DefaultAMQPHeartbeat},
		{url: "amqp://u:url@h/v", password: "file", host: "h", port: 5672, user: "u", pass: "file", vhost: "v", heartbeat: DefaultAMQPHeartbeat},
		{url: "amqp://[::1]:5672/v", host: "::1", port: 5672, user: "guest", pass: "guest", vhost: "v", heartbeat: DefaultAMQPHeartbeat},
		// Bad URLs.
		{url: "redis://h/0", err: `scheme "redis" is not an AMQP scheme`},
		{url: "amqp://h:notaport/v", err: "invalid port"},
		{url: "amqp://h:70000/v", err: `port "70000" is not a port number`},
		{url: "amqp://h/v?heartbeat=soon", err: `heartbeat="soon"`},
		{url: "amqp://h/v?connect_timeout=0", err: `connect_timeout="0"`},
		{url: "amqp://h/v?ssl=maybe", err: `ssl="maybe"`},
		{url: "amqps://h/v?ssl_cert_reqs=sometimes", err: "ssl_cert_reqs"},
		{url: "amqps://h/v?ssl_ca_certs=/nonexistent/ca.pem", err: "broker CA"},
		{url: "amqp://h/v?confirm=1", err: `unknown parameter "confirm"`},
		{url: "amqp:h", err: "want amqp://"},
		{url: "amqp://u:secret@h/v?bogus=1", err: "amqp://u:xxxxx@h/v"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			u, err := ParseAMQPURL(tt.url, tt.password)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.err)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Fatalf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if u.Host != tt.host || u.Port != tt.port || u.User != tt.user || u.Password != tt.pass || u.VHost != tt.vhost ||
				(u.TLS != nil) != tt.tls || u.Heartbeat != tt.heartbeat {
				t.Fatalf("got %+v (tls %v)", u, u.TLS != nil)
			}
			if strings.Contains(u.String(), ":"+u.Password+"@") {
				t.Fatalf("String() shows the password: %s", u)
			}
		})
	}
}

func TestParseAMQPURLs(t *testing.T) {
	us, err := ParseAMQPURLs("amqp://a:5672//;amqp://b:5673//", "")
	if err != nil || len(us) != 2 || us[0].Host != "a" || us[1].Port != 5673 {
		t.Fatalf("%+v %v", us, err)
	}
	if _, err := ParseAMQPURLs(" ; ", ""); err == nil {
		t.Fatal("an empty list parsed")
	}
	for raw, want := range map[string]bool{"amqp://h//": true, "pyamqp://h": true, "AMQPS://h": true, "librabbitmq://h": true,
		"redis://h": false, "sentinel://h;sentinel://i": false, "amqp://a;amqp://b": true, "": false} {
		if IsAMQPURL(raw) != want {
			t.Errorf("IsAMQPURL(%q) = %v", raw, !want)
		}
	}
}
