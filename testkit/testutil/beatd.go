package testutil

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/beatd/beatd/testkit/harness"
)

// beatd is the test process's one beatd binary, built on first use.
var beatd struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// BeatdBinary returns the test process's beatd binary, built by
// harness.BuildBeatd for the first test that asks: every later test of
// the package runs the same one instead of linking its own (seconds each,
// more on a loaded machine). The package's TestMain is MainWithBeatd.
func BeatdBinary(tb testing.TB) string {
	tb.Helper()
	beatd.once.Do(func() {
		if beatd.dir, beatd.err = os.MkdirTemp("", "beatd-bin"); beatd.err == nil {
			beatd.bin = filepath.Join(beatd.dir, "beatd")
			beatd.err = harness.BuildBeatd(beatd.bin)
		}
	})
	if beatd.err != nil {
		tb.Fatal(beatd.err)
	}
	return beatd.bin
}

// MainWithBeatd is TestMain for a package whose tests call BeatdBinary:
// it runs them, calls each of after (to stop the servers the package
// shares), removes the binary and exits with their code.
func MainWithBeatd(m *testing.M, after ...func()) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	if beatd.dir != "" {
		os.RemoveAll(beatd.dir)
	}
	os.Exit(code)
}
