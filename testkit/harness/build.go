package harness

import (
	"fmt"
	"io"
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
//
// make test links the binary once, before any test binary runs, and names
// it in BEATD_TEST_BIN: each package then copies it instead of linking its
// own under the lock (seconds of CPU each, six packages). Unset, as
// under a plain go test, the package builds it.
func BuildBeatd(out string) error {
	if prebuilt := os.Getenv("BEATD_TEST_BIN"); prebuilt != "" {
		return copyBinary(prebuilt, out)
	}
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/beatd")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: build beatd: %w\n%s", err, b)
	}
	return nil
}

// copyBinary copies the executable src to dst. A copy, not a link: a test
// may replace or remove its binary without touching the other packages'.
func copyBinary(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("harness: BEATD_TEST_BIN: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return fmt.Errorf("harness: copy beatd: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("harness: copy beatd from %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("harness: copy beatd: %w", err)
	}
	return nil
}
