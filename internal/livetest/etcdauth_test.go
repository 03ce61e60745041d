package livetest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdMTLSAndRBAC runs the beatd binary against an etcd that requires
// client certificates and has auth on, as a user whose role has readwrite
// only on the cluster's prefix (the election's keys live under it too),
// by password and by certificate CN. A user without permission on the
// prefix, or a wrong password, fails at start-up naming etcd.
func TestEtcdMTLSAndRBAC(t *testing.T) {
	t.Parallel() // judges what happened, not how fast: see main_test.go
	etcd := secureEtcd(t)
	c := etcd.Certs
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const pw = "etcd-pw-Vb83kL"
	for _, u := range []struct{ user, password, prefix string }{
		{"beatd-rbac", pw, "/beatd/rbac/"},
		{"beatd-cn", "", "/beatd/rbaccn/"},
		{"intruder", pw, "/other/"},
	} {
		if err := etcd.AddUser(ctx, u.user, u.password, u.prefix); err != nil {
			t.Fatal(err)
		}
	}
	if err := etcd.AddUserPerm(ctx, "reader", pw, "/beatd/rbac/", clientv3.PermissionType(clientv3.PermRead)); err != nil {
		t.Fatal(err)
	}
	// A client certificate whose CN is no user: with a password, the
	// password's user is who beatd is.
	anonCert, anonKey, err := c.Issue("etcd-anon", "beatd-client", false)
	if err != nil {
		t.Fatal(err)
	}
	cnCert, cnKey, err := c.Issue("etcd-cn", "beatd-cn", false)
	if err != nil {
		t.Fatal(err)
	}
	rs := testutil.MustStartRedis(t)
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", "entries:\n  rbac-tick: {task: tasks.tick, every: 1s}\n")
	args := func(prefix, cert, key string, extra ...string) []string {
		return append([]string{"--config", cfg, "--etcd-endpoints", etcd.Endpoint(), "--etcd-cacert", c.CA,
			"--etcd-cert", cert, "--etcd-key", key, "--prefix", prefix, "--broker", rs.URL(0), "--lease-ttl", "2s", "--id", "rbac1"}, extra...)
	}
	t.Run("role with readwrite on the prefix, by password", func(t *testing.T) {
		p := startBeatd(t, []string{"BEATD_ETCD_PASSWORD=" + pw}, args("/beatd/rbac/", anonCert, anonKey, "--etcd-username", "beatd-rbac")...)
		p.waitFired(3, 30*time.Second)
		code, body := p.get("/status")
		var st struct {
			Leader bool `json:"leader"`
		}
		if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || !st.Leader {
			t.Fatalf("/status %d: %s", code, body)
		}
	})
	t.Run("role with readwrite on the prefix, by certificate CN", func(t *testing.T) {
		p := startBeatd(t, nil, args("/beatd/rbaccn/", cnCert, cnKey)...)
		p.waitFired(3, 30*time.Second)
	})
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"role on another prefix", []string{"BEATD_ETCD_PASSWORD=" + pw},
			args("/beatd/rbac/", anonCert, anonKey, "--etcd-username", "intruder"), "permission denied"},
		{"read-only role on the prefix", []string{"BEATD_ETCD_PASSWORD=" + pw},
			args("/beatd/rbac/", anonCert, anonKey, "--etcd-username", "reader"), "guarded write on /beatd/rbac/: etcdserver: permission denied"},
		{"wrong CA", nil,
			append(args("/beatd/rbaccn/", cnCert, cnKey), "--etcd-cacert", c.WrongCA), "x509: certificate signed by unknown authority"},
		{"wrong password", []string{"BEATD_ETCD_PASSWORD=wrong-etcd-pw"},
			args("/beatd/rbac/", anonCert, anonKey, "--etcd-username", "beatd-rbac"), "authentication failed"},
		{"certificate CN without a role on the prefix", nil,
			args("/beatd/rbac/", cnCert, cnKey), "permission denied"},
		{"no client certificate", nil,
			[]string{"--config", cfg, "--etcd-endpoints", etcd.Endpoint(), "--etcd-cacert", c.CA, "--prefix", "/beatd/rbac/",
				"--broker", rs.URL(0), "--id", "rbac1"}, "etcd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := failsAtStart(t, tc.env, tc.args...)
			line := firstLine(out, "beatd:")
			t.Log(line)
			if !strings.Contains(line, tc.want) || !strings.Contains(line, "etcd "+etcd.Endpoint()) {
				t.Fatalf("start-up error %q does not name etcd and say %q:\n%s", line, tc.want, out)
			}
			if strings.Contains(out, pw) || strings.Contains(out, "wrong-etcd-pw") || strings.Contains(out, etcdRootPassword) {
				t.Fatalf("a password is in the output:\n%s", out)
			}
		})
	}
}
