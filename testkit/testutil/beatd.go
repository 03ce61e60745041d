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
// more on a loaded machine). The package's TestMain calls
// RemoveBeatdBinary after m.Run.
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

// RemoveBeatdBinary removes what BeatdBinary built, if it built anything.
func RemoveBeatdBinary() {
	if beatd.dir != "" {
		os.RemoveAll(beatd.dir)
	}
}
