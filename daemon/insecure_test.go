package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/internal/flagenv"
	beatdtest "github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestClientUnauthenticated: who can use the embedded member's client
// port without authenticating is judged from the addresses its listeners
// are bound to. Beyond loopback it is said once a minute, with the gauge
// at 1; on loopback once at start (any local user can), with the gauge
// at 0; client auth or an external etcd quiet it, and --etcd-insecure-ok
// turns it into one statement.
func TestClientUnauthenticated(t *testing.T) {
	tcp := func(hostport string) net.Addr {
		a, err := net.ResolveTCPAddr("tcp", hostport)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	const beyond, local = "without client certificate auth: whoever reaches it", "any local user on this machine"
	for _, tc := range []struct {
		name          string
		addrs         []net.Addr
		certAuth      bool
		insecureOK    bool
		wantGauge     float64
		wantWarnings  int // in two minutes
		wantText      string
		wantStatement bool
	}{
		{name: "external etcd", addrs: nil},
		{name: "single node on loopback", addrs: []net.Addr{tcp("127.0.0.1:2379")}, wantWarnings: 1, wantText: local},
		{name: "IPv6 loopback", addrs: []net.Addr{tcp("[::1]:2379")}, wantWarnings: 1, wantText: local},
		{name: "127.0.0.2 member", addrs: []net.Addr{tcp("127.0.0.2:23790")}, wantWarnings: 1, wantText: local},
		{name: "bound to 0.0.0.0", addrs: []net.Addr{tcp("0.0.0.0:2379")}, wantGauge: 1, wantWarnings: 3, wantText: "listens on 0.0.0.0:2379 " + beyond},
		{name: "bound to ::", addrs: []net.Addr{tcp("[::]:2379")}, wantGauge: 1, wantWarnings: 3, wantText: "listens on [::]:2379 " + beyond},
		{name: "pod IP", addrs: []net.Addr{tcp("10.0.0.7:2379")}, wantGauge: 1, wantWarnings: 3, wantText: "listens on 10.0.0.7:2379 " + beyond},
		{name: "loopback and pod IP", addrs: []net.Addr{tcp("127.0.0.1:2379"), tcp("10.0.0.7:2379")}, wantGauge: 1, wantWarnings: 3,
			wantText: "listens on 10.0.0.7:2379 " + beyond},
		{name: "client cert auth", addrs: []net.Addr{tcp("0.0.0.0:2379")}, certAuth: true},
		{name: "insecure ok", addrs: []net.Addr{tcp("0.0.0.0:2379")}, insecureOK: true, wantGauge: 1, wantStatement: true},
		{name: "insecure ok on loopback", addrs: []net.Addr{tcp("127.0.0.1:2379")}, insecureOK: true, wantStatement: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &beatdtest.SyncBuffer{}
			clock := clockwork.NewFakeClock()
			m := NewMain(io.Discard, io.Discard)
			m.clock = clock
			m.Cluster.InsecureOK = tc.insecureOK
			m.log = slog.New(slog.NewTextHandler(logs, nil))
			warned := func() int { return strings.Count(logs.String(), "level=WARN") }
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); m.warnClients(ctx, g, tc.addrs, tc.certAuth) }()
			if tc.wantWarnings == 3 {
				// Once at start, then once each minute.
				for i := 1; i <= 3; i++ {
					beatdtest.Eventually(t, 5*time.Second, fmt.Sprintf("warning %d", i), func() bool { return warned() >= i })
					if i < 3 {
						// The minute's ticker is armed after the first line.
						bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
						if err := clock.BlockUntilContext(bctx, 1); err != nil {
							t.Fatal("no ticker armed for the next warning")
						}
						bcancel()
						clock.Advance(time.Minute)
					}
				}
			} else {
				<-done // at most one line, at start: it returns
				clock.Advance(2 * time.Minute)
			}
			cancel()
			<-done
			if got := testutil.ToFloat64(g); got != tc.wantGauge {
				t.Errorf("gauge %v, want %v", got, tc.wantGauge)
			}
			if n := warned(); n != tc.wantWarnings {
				t.Errorf("%d warnings in two minutes, want %d:\n%s", n, tc.wantWarnings, logs.String())
			}
			if tc.wantText != "" && !strings.Contains(logs.String(), tc.wantText) {
				t.Errorf("the warning lacks %q:\n%s", tc.wantText, logs.String())
			}
			if tc.wantText == local && strings.Contains(logs.String(), "listens on") {
				t.Errorf("a loopback port is said to listen beyond it:\n%s", logs.String())
			}
			if got := strings.Contains(logs.String(), "as --etcd-insecure-ok states"); got != tc.wantStatement {
				t.Errorf("statement logged %v, want %v", got, tc.wantStatement)
			}
		})
	}
}

// TestClientUnauthenticatedAdvertisedLoopback: issue 47's false alarm. A
// member of the replicas' cluster advertised at http://127.0.0.1:P, with
// no listen URL, binds 127.0.0.1:P only; the check reads that socket, so
// it says "any local user", not that the port listens on 0.0.0.0, and
// the gauge stays 0.
func TestClientUnauthenticatedAdvertisedLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd member")
	}
	client, peer := beatdtest.FreePort(t), beatdtest.FreePort(t)
	srv, err := embedetcd.Start(embedetcd.Config{Dir: t.TempDir(), Name: "m0", InitialCluster: "m0=http://127.0.0.1:" + strconv.Itoa(peer),
		AdvertiseClientURL: "http://127.0.0.1:" + strconv.Itoa(client), Context: context.Background()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, a := range srv.ClientAddrs() {
		if tcp, ok := a.(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() {
			t.Fatalf("the member bound %v, want loopback only", srv.ClientAddrs())
		}
	}
	logs := &beatdtest.SyncBuffer{}
	m := NewMain(io.Discard, io.Discard)
	m.clock, m.embedded = clockwork.NewFakeClock(), srv
	m.Cluster = clusterFlags{InitialCluster: "m0=http://127.0.0.1:" + strconv.Itoa(peer), AdvertiseClientURL: "http://127.0.0.1:" + strconv.Itoa(client)}
	m.log = slog.New(slog.NewTextHandler(logs, nil))
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	m.warnUnauthenticated(context.Background(), g)
	if got := testutil.ToFloat64(g); got != 0 {
		t.Errorf("beatd_etcd_client_unauthenticated %v for a loopback-bound port, want 0", got)
	}
	if strings.Contains(logs.String(), "0.0.0.0") || strings.Contains(logs.String(), "listens on") {
		t.Errorf("false alarm:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "any local user") || !strings.Contains(logs.String(), "127.0.0.1:"+strconv.Itoa(client)) {
		t.Errorf("want one WARN naming 127.0.0.1:%d and any local user:\n%s", client, logs.String())
	}
}

// TestArgvSecrets: a password in a URL flag is noted when it came from
// the command line, not when it came from the environment.
func TestArgvSecrets(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"broker password in argv", []string{"--broker", "redis://:s3cret@127.0.0.1:6379/0"}, nil, []string{"--broker"}},
		{"user without password", []string{"--broker", "redis://bob@127.0.0.1:6379/0"}, nil, nil},
		{"from the environment", nil, map[string]string{"BEATD_BROKER": "redis://:s3cret@127.0.0.1:6379/0"}, nil},
		{"result backend and etcd", []string{"--result-backend", "redis://:x@h/1", "--etcd-endpoints", "http://a:2379,http://u:p@b:2379"}, nil,
			[]string{"--result-backend", "--etcd-endpoints"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			m := NewMain(io.Discard, io.Discard)
			fs := m.Flags()
			if err := flagenv.Parse(fs, tc.args); err != nil {
				t.Fatal(err)
			}
			m.NoteArgvSecrets(fs)
			if !slices.Equal(m.argvSecrets, tc.want) {
				t.Errorf("noted %v, want %v", m.argvSecrets, tc.want)
			}
		})
	}
}
