package doctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// root is the module's directory; README's commands run there, as in a
// fresh checkout.
var root string

// isInstall reports whether b is README's Install block (its first
// command is `go build`), which TestMain runs to build bin/beatd: every
// doc's `beatd` is that binary.
func isInstall(b Block) bool {
	if b.File != "README.md" || !b.Shell() {
		return false
	}
	cmds, err := b.Commands()
	return err == nil && len(cmds) > 0 && strings.HasPrefix(cmds[0].Text, "go build ")
}

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	root = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	// The commands find go, and then beatd, as a user's shell does.
	os.Setenv("PATH", filepath.Join(root, "bin")+string(os.PathListSeparator)+
		filepath.Join(runtime.GOROOT(), "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	if err := runInstall(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// runInstall runs the commands of README's Install block in the module's
// directory, exactly as written, with CGO_ENABLED=0: the static build
// every other test runs (harness.BuildBeatd), so the build cache serves
// it instead of a second full compile while the package holds
// .ci/serial's lock.
func runInstall() error {
	blocks, err := parseFile("README.md")
	if err != nil {
		return err
	}
	for _, b := range blocks {
		if !isInstall(b) || b.Illustrative != "" {
			continue
		}
		cmds, err := b.Commands()
		if err != nil {
			return err
		}
		for _, c := range cmds {
			cmd := exec.Command("sh", "-c", c.Text)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("README.md:%d: %s: %w\n%s", c.Line, c.Text, err, out)
			}
		}
		return nil
	}
	return fmt.Errorf("README.md has no Install block (a ```sh block starting with go build) to build bin/beatd")
}

func parseFile(rel string) ([]Block, error) {
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	return Parse(rel, string(data))
}

// docFiles are README.md and docs/*.md, relative to the module.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, d := range docs {
		out = append(out, strings.TrimPrefix(d, root+string(filepath.Separator)))
	}
	return out
}
