package livetest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/beatd/beatd/testkit/testutil"
)

// Parallel tests: a test calls t.Parallel() only if it judges what
// happened (counts, contents, errors), never how fast (no budget but a
// generous wait for liveness), and shares no broker queue with another
// test (its own Redis, or a shared server under names of its own; not
// the shared RabbitMQ, SQS or Sentinel topology). go test runs those
// after every other test of the package, two at a time (GOMAXPROCS), so
// the tests that time failovers and shutdowns never run beside them; most
// of theirs is waiting (an outage of 20 s, observation windows), which
// the other one's work fills.

// beatdBin is the binary under test, built once.
var beatdBin string

// shared holds the slow servers, started on first use and stopped when
// the package's tests end: one Sentinel topology, one TLS PKI, one
// secure etcd.
var shared struct {
	dir string

	sentinelOnce sync.Once
	sentinel     *harness.SentinelTopology
	sentinelErr  error

	certsOnce sync.Once
	certs     *testutil.Certs
	certsErr  error

	etcdOnce sync.Once
	etcd     *testutil.SecureEtcd
	etcdErr  error

	rabbitOnce sync.Once
	rabbit     *harness.Rabbit
	rabbitErr  error

	sqsOnce sync.Once
	sqs     *harness.SQS
	sqsErr  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "beatd-livetest")
	if err != nil {
		panic(err)
	}
	shared.dir = dir
	beatdBin = filepath.Join(dir, "beatd")
	if err := harness.BuildBeatd(beatdBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if shared.sentinel != nil {
		shared.sentinel.Stop()
	}
	if shared.etcd != nil {
		shared.etcd.Stop()
	}
	if shared.rabbit != nil {
		shared.rabbit.Close()
	}
	if shared.sqs != nil {
		shared.sqs.Close()
	}
	if tlsRedisShared.proc != nil {
		tlsRedisShared.proc.Kill()
	}
	if mtlsRedisShared.proc != nil {
		mtlsRedisShared.proc.Kill()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func sentinelTopology(t *testing.T) *harness.SentinelTopology {
	t.Helper()
	shared.sentinelOnce.Do(func() {
		d := filepath.Join(shared.dir, "sentinel")
		if err := os.MkdirAll(d, 0o755); err != nil {
			shared.sentinelErr = err
			return
		}
		shared.sentinel, shared.sentinelErr = harness.StartSentinelTopology(d)
	})
	if shared.sentinelErr != nil {
		t.Fatal(shared.sentinelErr)
	}
	return shared.sentinel
}

func certs(t *testing.T) *testutil.Certs {
	t.Helper()
	shared.certsOnce.Do(func() {
		d := filepath.Join(shared.dir, "pki")
		if err := os.MkdirAll(d, 0o755); err != nil {
			shared.certsErr = err
			return
		}
		shared.certs, shared.certsErr = testutil.WriteCerts(d)
	})
	if shared.certsErr != nil {
		t.Fatal(shared.certsErr)
	}
	return shared.certs
}

// sharedRabbit is the package's rabbitmq-server, started on first use.
func sharedRabbit(t *testing.T) *harness.Rabbit {
	t.Helper()
	shared.rabbitOnce.Do(func() {
		d := filepath.Join(shared.dir, "rabbit")
		if shared.rabbitErr = os.MkdirAll(d, 0o755); shared.rabbitErr == nil {
			shared.rabbit, shared.rabbitErr = harness.StartRabbit(d)
		}
	})
	if shared.rabbitErr != nil {
		t.Fatal(shared.rabbitErr)
	}
	return shared.rabbit
}

// sharedSQS is the package's SQS emulator, started on first use.
func sharedSQS(t *testing.T) *harness.SQS {
	t.Helper()
	shared.sqsOnce.Do(func() {
		shared.sqs, shared.sqsErr = harness.StartSQS(filepath.Join(shared.dir, "sqs"))
	})
	if shared.sqsErr != nil {
		t.Fatal(shared.sqsErr)
	}
	return shared.sqs
}

// etcdRootPassword is the secure etcd's root password.
const etcdRootPassword = "root-pw-Zq81"

// secureEtcd is the package's etcd with mTLS and auth enabled, and users
// made by the README's commands (AddUser).
func secureEtcd(t *testing.T) *testutil.SecureEtcd {
	t.Helper()
	c := certs(t)
	shared.etcdOnce.Do(func() {
		d := filepath.Join(shared.dir, "etcd")
		if err := os.MkdirAll(d, 0o755); err != nil {
			shared.etcdErr = err
			return
		}
		e, err := testutil.StartSecureEtcd(d, c)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = e.EnableAuth(ctx, etcdRootPassword)
			cancel()
			if err != nil {
				e.Stop()
			}
		}
		shared.etcd, shared.etcdErr = e, err
	})
	if shared.etcdErr != nil {
		t.Fatal(shared.etcdErr)
	}
	return shared.etcd
}

// proc is one beatd process, logging to a file of its own.
type proc struct {
	*harness.Replica
	t *testing.T
}

// output is everything the process wrote so far.
func (p *proc) output() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// startBeatd runs the binary with args plus --http and --id, and env.
func startBeatd(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	port := testutil.FreePort(t)
	p := &proc{t: t, Replica: &harness.Replica{ID: "live", Bin: beatdBin, HTTPPort: port, Env: env,
		LogPath: filepath.Join(t.TempDir(), "beatd.log"),
		Args:    append([]string{"run", "--http", "127.0.0.1:" + strconv.Itoa(port), "--log-format", "json"}, args...)}}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- beatd output ---\n%s", tail(p.output(), 60))
		}
	})
	return p
}

// stop sends SIGTERM (a graceful stop persists what was published) and
// waits for the exit.
func (p *proc) stop() { p.Proc().Stop(15 * time.Second) }

// failsAtStart runs beatd and expects it to exit 1 on its own, before it
// ever fires; it returns the output.
func failsAtStart(t *testing.T, env []string, args ...string) string {
	t.Helper()
	p := startBeatd(t, env, args...)
	if !p.Wait(40 * time.Second) {
		t.Fatalf("beatd did not fail at start-up:\n%s", tail(p.output(), 30))
	}
	out := p.output()
	if p.ExitCode() != 1 {
		t.Fatalf("beatd exited %d, want 1:\n%s", p.ExitCode(), out)
	}
	if strings.Contains(out, `"msg":"fired"`) {
		t.Fatalf("beatd fired before failing:\n%s", out)
	}
	return out
}

func (p *proc) get(path string) (int, string) {
	resp, err := http.Get(p.URL(path))
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFired waits until beatd has logged n fires; it fails at once if
// beatd exits.
func (p *proc) waitFired(n int, timeout time.Duration) {
	p.t.Helper()
	testutil.EventuallyEvery(p.t, timeout, 50*time.Millisecond, fmt.Sprintf("%d fires", n), func() bool {
		if !p.Running() {
			p.t.Fatalf("beatd exited %d after %d of %d fires", p.ExitCode(), p.fired(), n)
		}
		return p.fired() >= n
	})
}

// fired counts the "fired" log lines so far.
func (p *proc) fired() int { return strings.Count(p.output(), `"msg":"fired"`) }

func waitFor(t *testing.T, timeout time.Duration, what string, ok func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, timeout, 50*time.Millisecond, what, ok)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// slotKey is one (entry, slot) as a message's headers name it.
type slotKey struct {
	Entry string
	Slot  string
}
