package livetest

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

// TestSecretsNeverLeak runs the beatd binary with a broker password (in
// the URL, where people put it), an admin token and an etcd password,
// through failures: wrong passwords at start-up, bad admin tokens, the
// broker going away and coming back without its password. No secret may
// appear in any log line, error message, /status, /readyz or /metrics.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel() // judges what happened, not how fast: see main_test.go
	const (
		brokerPW   = "brokerSecret-9fQ2"
		wrongPW    = "wrongBrokerSecret-Lm4"
		adminToken = "adminSecret-Xw7p"
		badToken   = "guessedToken-Rt5e"
		etcdPW     = "etcdSecret-Pz3k"
		wrongEtcd  = "wrongEtcdSecret-Jh6"
	)
	secrets := []string{brokerPW, wrongPW, adminToken, badToken, etcdPW, wrongEtcd, etcdRootPassword}
	ctx := context.Background()
	etcd := secureEtcd(t)
	if err := etcd.AddUser(ctx, "secrets", etcdPW, "/beatd/secrets/"); err != nil {
		t.Fatal(err)
	}
	cert, key, err := etcd.Certs.Issue("etcd-secrets", "beatd-client", false)
	if err != nil {
		t.Fatal(err)
	}
	rs := testutil.MustStartRedis(t)
	if err := rs.Client().ConfigSet(ctx, "requirepass", brokerPW).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", "entries:\n  secret-tick: {task: tasks.tick, every: 1s}\n")
	args := func(brokerPass string) []string {
		return []string{"--config", cfg, "--etcd-endpoints", etcd.Endpoint(), "--etcd-cacert", etcd.Certs.CA,
			"--etcd-cert", cert, "--etcd-key", key, "--etcd-username", "secrets", "--prefix", "/beatd/secrets/",
			"--broker", "redis://:" + brokerPass + "@" + rs.Addr() + "/0", "--lease-ttl", "2s", "--id", "sec1"}
	}
	var seen []string // every output and HTTP body, to grep
	env := func(etcdPass string) []string {
		return []string{"BEATD_ETCD_PASSWORD=" + etcdPass, "BEATD_ADMIN_TOKEN=" + adminToken}
	}

	// Start-up failures.
	seen = append(seen, failsAtStart(t, env(etcdPW), args(wrongPW)...))
	seen = append(seen, failsAtStart(t, env(wrongEtcd), args(brokerPW)...))

	// A run through failures.
	p := startBeatd(t, env(etcdPW), args(brokerPW)...)
	p.waitFired(2, 30*time.Second)
	base := "http://127.0.0.1:" + strconv.Itoa(p.HTTPPort)
	for _, tok := range []string{badToken, adminToken, ""} {
		req, _ := http.NewRequest(http.MethodPost, base+"/entries/secret-tick/trigger", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	grab := func() {
		for _, path := range []string{"/status", "/readyz", "/metrics", "/healthz"} {
			_, body := p.get(path)
			seen = append(seen, body)
		}
	}
	grab()
	// The broker dies, and comes back with another password: AUTH fails
	// until the password is set back.
	rs.Stop()
	time.Sleep(3 * time.Second) // the scenario: three seconds of outage, whose logs are grabbed
	grab()
	rs.Start()
	const rotated = "rotatedSecret-Qa1z"
	secrets = append(secrets, rotated)
	// Connections made before the change stay authenticated: drop them.
	if err := rs.Client().ConfigSet(ctx, "requirepass", rotated).Err(); err != nil {
		t.Fatal(err)
	}
	rotatedClient := redis.NewClient(&redis.Options{Addr: rs.Addr(), Password: rotated})
	defer rotatedClient.Close()
	if err := rotatedClient.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a publish refused by AUTH", func() bool {
		return strings.Contains(p.output(), "WRONGPASS")
	})
	grab()
	if err := rotatedClient.ConfigSet(ctx, "requirepass", brokerPW).Err(); err != nil {
		t.Fatal(err)
	}
	fired := p.fired()
	p.waitFired(fired+2, 20*time.Second)
	grab()
	p.stop()
	seen = append(seen, p.output())

	all := strings.Join(seen, "\n")
	lines := strings.Count(all, "\n")
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			start := max(0, i-200)
			t.Fatalf("secret %q leaked:\n...%s...", s, all[start:min(len(all), i+100)])
		}
	}
	// The run did go through the failures it claims to.
	for _, want := range []string{"WRONGPASS", "authentication failed", "publish failed", "broker redis://:xxxxx@"} {
		if !strings.Contains(all, want) {
			t.Fatalf("the run never showed %q; output:\n%s", want, tail(all, 40))
		}
	}
	t.Logf("%d lines of output and HTTP bodies, no secret in any", lines)
}
