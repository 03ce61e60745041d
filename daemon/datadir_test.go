package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	beatdtest "github.com/beatd/beatd/testkit/testutil"
)

// TestDataDirUnusable: a data dir beatd cannot write stops the replica
// (Run fails, so Serve exits 1) after one ERROR line that names the data
// dir and the cause. Tests run as root, whom file modes do not stop, so
// the data dir is made unusable by a regular file where a directory must
// be: the data dir itself, a parent of it, or its etcd directory.
func TestDataDirUnusable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, root string) string // the --data-dir
	}{
		{name: "data dir is a file", setup: func(t *testing.T, root string) string {
			p := filepath.Join(root, "data")
			mustWrite(t, p)
			return p
		}},
		{name: "data dir under a file", setup: func(t *testing.T, root string) string {
			mustWrite(t, filepath.Join(root, "file"))
			return filepath.Join(root, "file", "data")
		}},
		{name: "etcd dir is a file", setup: func(t *testing.T, root string) string {
			p := filepath.Join(root, "data")
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
			mustWrite(t, filepath.Join(p, "etcd"))
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dataDir := tc.setup(t, root)
			config := filepath.Join(root, "schedules.yaml")
			if err := os.WriteFile(config, []byte("entries:\n  tick: {task: tasks.add, every: 1s}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			logs := &beatdtest.SyncBuffer{}
			m := newTestMain(logs, io.Discard)
			if err := m.ParseFlags(context.Background(), []string{"--config", config, "--data-dir", dataDir,
				"--etcd-client-port", strconv.Itoa(beatdtest.FreePort(t)), "--etcd-peer-port", strconv.Itoa(beatdtest.FreePort(t)),
				"--http", "127.0.0.1:0", "--broker", "redis://127.0.0.1:1/0"}); err != nil {
				t.Fatal(err)
			}
			err := m.Run(context.Background())
			_ = m.Close()
			if err == nil {
				t.Fatal("Run started on an unusable data dir")
			}
			var found bool
			sc := bufio.NewScanner(strings.NewReader(logs.String()))
			for sc.Scan() {
				var line map[string]any
				if json.Unmarshal(sc.Bytes(), &line) != nil || line["level"] != "ERROR" {
					continue
				}
				if line["data_dir"] == dataDir && line["cause"] == "not a directory" {
					found = true
				}
			}
			if !found {
				t.Errorf("no ERROR line with data_dir %q and cause %q; Run: %v; log:\n%s", dataDir, "not a directory", err, logs.String())
			}
		})
	}
}

func mustWrite(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("not a directory\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}
