package daemon

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/internal/flagenv"
	beatdtest "github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestClientUnauthenticated: an embedded member whose client port listens
// beyond loopback without client certificate auth is said aloud, once a
// minute, with a gauge; loopback, client auth, or --etcd-insecure-ok
// quiet it.
func TestClientUnauthenticated(t *testing.T) {
	for _, tc := range []struct {
		name          string
		cluster       clusterFlags
		wantGauge     float64
		wantWarnings  int // in two minutes
		wantStatement bool
	}{
		{"single node", clusterFlags{}, 0, 0, false},
		{"default listen 0.0.0.0", clusterFlags{InitialCluster: "a=http://a:2380"}, 1, 3, false},
		{"pod IP", clusterFlags{InitialCluster: "a=http://a:2380", ListenClientURL: "http://10.0.0.7:2379"}, 1, 3, false},
		{"loopback", clusterFlags{InitialCluster: "a=http://a:2380", ListenClientURL: "http://127.0.0.1:2379"}, 0, 0, false},
		{"client cert auth", clusterFlags{InitialCluster: "a=https://a:2380", ClientCertAuth: true}, 0, 0, false},
		{"insecure ok", clusterFlags{InitialCluster: "a=http://a:2380", InsecureOK: true}, 1, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &beatdtest.SyncBuffer{}
			clock := clockwork.NewFakeClock()
			m := NewMain(io.Discard, io.Discard)
			m.clock, m.Cluster = clock, tc.cluster
			m.log = slog.New(slog.NewTextHandler(logs, nil))
			warned := func() int { return strings.Count(logs.String(), "without client certificate auth: whoever reaches it") }
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); m.warnUnauthenticated(ctx, g) }()
			if tc.wantWarnings > 0 {
				// Once at start, then once each minute.
				for i := 1; i <= 3; i++ {
					deadline := time.Now().Add(5 * time.Second)
					for warned() < i && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
					}
					if i < 3 {
						clock.Advance(time.Minute)
					}
				}
			} else {
				time.Sleep(20 * time.Millisecond) // room for a warning that must not come
			}
			cancel()
			<-done
			if got := testutil.ToFloat64(g); got != tc.wantGauge {
				t.Errorf("gauge %v, want %v", got, tc.wantGauge)
			}
			if n := warned(); n != tc.wantWarnings {
				t.Errorf("%d warnings in two minutes, want %d:\n%s", n, tc.wantWarnings, logs.String())
			}
			if got := strings.Contains(logs.String(), "as --etcd-insecure-ok states"); got != tc.wantStatement {
				t.Errorf("statement logged %v, want %v", got, tc.wantStatement)
			}
		})
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
