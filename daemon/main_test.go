package daemon

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/testkit/testutil"
)

// newTestMain is NewMain for a test: it leaves the test process's GOGC
// and GOMAXPROCS alone, which the package's other tests share.
func newTestMain(stdout, stderr io.Writer) *Main {
	m := NewMain(stdout, stderr)
	m.tune, m.release, m.lift = func(int) {}, func() {}, nil
	return m
}

// runMain starts a Main in-process, as main does, and closes it when the
// test ends.
func runMain(t *testing.T, args ...string) *Main {
	t.Helper()
	m := newTestMain(io.Discard, io.Discard)
	if err := m.ParseFlags(context.Background(), args); err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// TestEmbeddedStateSurvivesRestart: with no --etcd-endpoints beatd runs
// its own etcd in --data-dir, on the configured ports, and a restart
// resumes from the state it persisted there.
func TestEmbeddedStateSurvivesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs beatd with an embedded etcd")
	}
	rs := testutil.MustStartRedis(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(config, []byte("entries:\n  tick: {task: tasks.add, every: 1s, args: [1, 1]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", config, "--data-dir", filepath.Join(dir, "data"), "--broker", rs.URL(0),
		"--etcd-client-port", strconv.Itoa(testutil.FreePort(t)), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)),
		"--http", "127.0.0.1:0", "--lease-ttl", "2s"}
	runs := func(m *Main) int64 {
		st, err := m.api.Status(context.Background(), api.StatusQuery{Limit: api.DefaultStatusLimit})
		if err != nil || len(st.Entries) != 1 {
			return -1
		}
		return st.Entries[0].TotalRunCount
	}

	first := runMain(t, args...)
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "three fires", func() bool { return runs(first) >= 3 })
	before, err := first.api.Status(context.Background(), api.StatusQuery{Limit: api.DefaultStatusLimit})
	if err != nil || len(before.Entries[0].RecentRuns) == 0 {
		t.Fatalf("status before restart: %+v, %v", before, err)
	}
	published := before.Entries[0].RecentRuns[0].Slot
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// Close persisted every publish; read what the data dir holds now.
	second := runMain(t, args...)
	// A status read before etcd answers within its budget is the config's,
	// with no state, flagged stale: wait for one read from etcd.
	var st api.Status
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a status read from etcd after the restart", func() bool {
		st, err = second.api.Status(context.Background(), api.StatusQuery{Limit: api.DefaultStatusLimit})
		return err != nil || !st.Stale
	})
	if err != nil || len(st.Entries) != 1 {
		t.Fatalf("status after restart: %+v, %v", st, err)
	}
	if got := st.Entries[0].TotalRunCount; got < 3 {
		t.Fatalf("after restart total_run_count = %d, want the first run's 3 or more", got)
	}
	// The last slot comes from the embedded etcd's data dir: Close wrote
	// every slot published before it.
	if st.Entries[0].LastSlot == nil || st.Entries[0].LastSlot.Before(published) || len(st.Entries[0].RecentRuns) < 3 {
		t.Fatalf("state not restored: %+v, want a last slot at or after %s", st.Entries[0], published)
	}
}
