package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/beatd/beatd/testkit/harness"
)

var binPath string

// TestMain builds one static beatd (CGO_ENABLED=0, as the image ships it)
// for every test of the package: the flag check, the manifest run and the
// image.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "beatd-deploy")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "beatd")
	if err := harness.BuildBeatd(binPath); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func beatdBin() string { return binPath }
