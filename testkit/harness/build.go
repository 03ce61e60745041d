package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// BuildBeatd builds ./cmd/beatd into out the one way every test that runs
// the binary builds it: static (CGO_ENABLED=0), as the image ships it.
// One build flavour lets the build cache serve every package after the
// first, and make test's `go vet` (run with CGO_ENABLED=0 too) has
// already compiled every package beatd imports. The build matters for
// time: a test's build holds .ci/serial's lock, so an uncached one stalls
// every package waiting to run.
func BuildBeatd(out string) error {
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/beatd")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: build beatd: %w\n%s", err, b)
	}
	return nil
}
