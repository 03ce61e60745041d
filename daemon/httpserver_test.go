package daemon

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestHTTPTimeouts: a kept-alive connection that sends nothing more is
// closed after the idle timeout, while the console's live stream outlives
// the server's read and write timeouts.
func TestHTTPTimeouts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with etcd and Redis")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	rs := testutil.MustStartRedis(t)
	config := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(config, []byte("entries:\n  tick: {task: tasks.add, every: 200ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := newTestMain(io.Discard, io.Discard)
	if err := m.ParseFlags(context.Background(), []string{"--config", config, "--etcd-endpoints", strings.Join(srv.Endpoints, ","),
		"--broker", rs.URL(0), "--http", "127.0.0.1:0", "--lease-ttl", "2s"}); err != nil {
		t.Fatal(err)
	}
	const idle, write = 400 * time.Millisecond, 300 * time.Millisecond
	m.HTTPTimeouts = HTTPTimeouts{Idle: idle, Read: write, Write: write}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })

	t.Run("idle connection closed", func(t *testing.T) {
		conn, err := net.Dial("tcp", m.HTTPAddress())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		// Two requests on one connection: it is kept alive between them.
		for range 2 {
			if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: beatd\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Close {
				t.Fatalf("healthz: %d, close %v", resp.StatusCode, resp.Close)
			}
		}
		start := time.Now()
		_ = conn.SetReadDeadline(start.Add(10 * time.Second))
		_, err = br.ReadByte()
		took := time.Since(start)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the idle connection is still open after %s (idle timeout %s)", took, idle)
		}
		if !errors.Is(err, io.EOF) {
			t.Fatalf("idle connection: %v, want EOF", err)
		}
		if took > idle+2*time.Second {
			t.Errorf("closed after %s, want about %s", took, idle)
		}
	})

	t.Run("live stream outlives the timeouts", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.HTTPAddress()+"/console/events?view=overview", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("events: %d", resp.StatusCode)
		}
		start := time.Now()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		// The leader fires every 200 ms, so the timeline changes and the
		// stream carries an event at least every second or so.
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "event: sections") && time.Since(start) > 5*write+idle {
				return
			}
		}
		t.Fatalf("the stream ended after %s (write timeout %s): %v", time.Since(start), write, sc.Err())
	})
}
