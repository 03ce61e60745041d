package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
	cmd := exec.Command("go", "build", "-o", binPath, "../cmd/beatd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build beatd: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func beatdBin() string { return binPath }
