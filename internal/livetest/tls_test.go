package livetest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

// sharedRedis is a redis-server started once for the package.
type sharedRedis struct {
	once sync.Once
	proc *harness.RedisProc
	err  error
}

var tlsRedisShared, mtlsRedisShared sharedRedis

// tlsRedis is the package's redis-server that only speaks TLS (port 0,
// tls-port), with certificates from certs(); client certificates are
// optional.
func tlsRedis(t *testing.T) *harness.RedisProc {
	return startTLSRedis(t, &tlsRedisShared, "optional")
}

// mtlsRedis is like tlsRedis but requires a client certificate.
func mtlsRedis(t *testing.T) *harness.RedisProc {
	return startTLSRedis(t, &mtlsRedisShared, "yes")
}

func startTLSRedis(t *testing.T, sh *sharedRedis, authClients string) *harness.RedisProc {
	t.Helper()
	c := certs(t)
	sh.once.Do(func() {
		port, err := harness.FreePort()
		if err != nil {
			sh.err = err
			return
		}
		d := filepath.Join(shared.dir, "redis-tls-"+authClients)
		if err := os.MkdirAll(d, 0o755); err != nil {
			sh.err = err
			return
		}
		probe := c.ClientTLS()
		if authClients == "yes" {
			cert, key, err := c.Issue("redis-probe", "probe", false)
			if err == nil {
				probe, err = c.ClientTLSWithCert(cert, key)
			}
			if err != nil {
				sh.err = err
				return
			}
		}
		p := &harness.RedisProc{Bin: "redis-server", Port: port, Dir: d, TLS: probe, Args: []string{
			"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--tls-cert-file", c.ServerCert, "--tls-key-file", c.ServerKey, "--tls-ca-cert-file", c.CA,
			"--tls-auth-clients", authClients}}
		sh.err = p.Start()
		sh.proc = p
	})
	if sh.err != nil {
		t.Fatal(sh.err)
	}
	return sh.proc
}

// TestTLSAndACL runs the beatd binary over rediss:// with
// ssl_cert_reqs=required and a CA, as the README's least-privilege ACL
// user: it publishes. Each wrong setting fails at start-up with an error
// naming the broker (password redacted), before any fire.
func TestTLSAndACL(t *testing.T) {
	c := certs(t)
	srv := tlsRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), TLSConfig: c.ClientTLS()})
	defer admin.Close()
	const pw = "acl-pw-7Hq2xW"
	setUser := func(name string, rules ...any) {
		t.Helper()
		args := append([]any{"ACL", "SETUSER", name, "reset"}, rules...)
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s: %v", name, err)
		}
	}
	var least []any
	for _, r := range testutil.DocumentedACL(t, pw) {
		least = append(least, r)
	}
	setUser("beatd", least...)
	setUser("noevalsha", append(append([]any{}, least...), "-evalsha")...)
	clientCert, clientKey, err := c.Issue("redis-client", "beatd", false)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	cfg := writeFile(t, dir, "schedules.yaml", "entries:\n  tls-tick: {task: tasks.tick, every: 1s}  # queue celery, as the README ACL line allows\n")
	broker := func(user, ca string, extra ...string) string {
		q := url.Values{"ssl_cert_reqs": {"required"}, "ssl_ca_certs": {ca}}
		for i := 0; i+1 < len(extra); i += 2 {
			q.Set(extra[i], extra[i+1])
		}
		return fmt.Sprintf("rediss://%s@%s/0?%s", user, srv.Addr(), q.Encode())
	}
	run := func(t *testing.T, brokerURL, prefix string) (env []string, args []string) {
		etcd := testutil.MustStartEmbeddedEtcd(t)
		return []string{"BEATD_BROKER_PASSWORD=" + pw},
			[]string{"--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", prefix,
				"--broker", brokerURL, "--lease-ttl", "2s", "--id", "tls1"}
	}

	t.Run("publishes over TLS as the least-privilege user", func(t *testing.T) {
		for i, u := range []string{broker("beatd", c.CA), broker("beatd", c.CA, "ssl_certfile", clientCert, "ssl_keyfile", clientKey)} {
			env, args := run(t, u, fmt.Sprintf("/beatd/tls%d/", i))
			before := admin.LLen(ctx, "celery").Val()
			p := startBeatd(t, env, args...)
			p.waitFired(3, 30*time.Second)
			if n := admin.LLen(ctx, "celery").Val(); n < before+3 {
				t.Fatalf("queue celery has %d new messages, want 3 or more", n-before)
			}
			p.stop()
		}
	})
	mtls := mtlsRedis(t)
	mtlsAdmin := redis.NewClient(&redis.Options{Addr: mtls.Addr(), TLSConfig: mtlsTLS(t, c)})
	defer mtlsAdmin.Close()
	if err := mtlsAdmin.Do(ctx, append([]any{"ACL", "SETUSER", "beatd", "reset"}, least...)...).Err(); err != nil {
		t.Fatal(err)
	}
	mtlsBroker := func(extra ...string) string {
		q := url.Values{"ssl_cert_reqs": {"required"}, "ssl_ca_certs": {c.CA}}
		for i := 0; i+1 < len(extra); i += 2 {
			q.Set(extra[i], extra[i+1])
		}
		return fmt.Sprintf("rediss://beatd@%s/0?%s", mtls.Addr(), q.Encode())
	}
	t.Run("publishes with a client certificate where one is required", func(t *testing.T) {
		env, args := run(t, mtlsBroker("ssl_certfile", clientCert, "ssl_keyfile", clientKey), "/beatd/mtls/")
		p := startBeatd(t, env, args...)
		p.waitFired(2, 30*time.Second)
		p.stop()
	})
	for _, tc := range []struct {
		name     string
		broker   string
		password string
		want     []string
	}{
		{"no client certificate where one is required", mtlsBroker(), pw, []string{"tls: certificate required"}},
		{"wrong CA", broker("beatd", c.WrongCA), pw, []string{"x509: certificate signed by unknown authority"}},
		{"user without EVALSHA", broker("noevalsha", c.CA), pw, []string{"EVALSHA", "NOPERM"}},
		{"wrong password", broker("beatd", c.CA), "not-the-password", []string{"WRONGPASS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, args := run(t, tc.broker, "/beatd/tlsbad/")
			out := failsAtStart(t, []string{"BEATD_BROKER_PASSWORD=" + tc.password}, args...)
			// The error names the broker, as its URL without the query.
			want := append(tc.want, "broker "+strings.SplitN(tc.broker, "?", 2)[0])
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Fatalf("start-up error does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, pw) || strings.Contains(out, "not-the-password") {
				t.Fatalf("a password is in the output:\n%s", out)
			}
			t.Logf("%s", firstLine(out, "beatd:"))
		})
	}
}

// firstLine returns the first line of out that starts with prefix.
func firstLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
		// beatd run reports a failed start as a log line in its format:
		// {"msg":"beatd failed to start","errors":[...]}.
		var rec struct {
			Msg    string   `json:"msg"`
			Errors []string `json:"errors"`
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "beatd failed to start" {
			return "beatd: " + strings.Join(rec.Errors, "; ")
		}
	}
	return ""
}

func mtlsTLS(t *testing.T, c *testutil.Certs) *tls.Config {
	t.Helper()
	cert, key, err := c.Issue("redis-admin", "admin", false)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.ClientTLSWithCert(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return tc
}
