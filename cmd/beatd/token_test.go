package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/beatd/beatd/auth"
)

// TestTokenNewLine: what `beatd token new` writes to stderr is one line,
// and appended to a tokens file, as docs/access.md does with 2>>, it
// makes a file the tokens-file loader accepts, holding the new token.
func TestTokenNewLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		file string // before the append
	}{
		{name: "fresh file", file: "tokens:\n"},
		{name: "after other tokens", file: "tokens:\n  bob: {role: read, sha256: " + strings.Repeat("ab", 32) + "}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), []string{"token", "new", "alice", "--role", "operate"}, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if n := strings.Count(stderr.String(), "\n"); n != 1 || !strings.HasSuffix(stderr.String(), "\n") {
				t.Fatalf("stderr is %d lines, want one:\n%s", n, stderr.String())
			}
			path := filepath.Join(t.TempDir(), "tokens.yaml")
			if err := os.WriteFile(path, []byte(tc.file+stderr.String()), 0o600); err != nil {
				t.Fatal(err)
			}
			tbl, err := auth.Load(path)
			if err != nil {
				t.Fatalf("the appended line makes an invalid tokens file: %v\n%s%s", err, tc.file, stderr.String())
			}
			id, ok := tbl[sha256.Sum256([]byte(strings.TrimSpace(stdout.String())))]
			if !ok || id.Name != "alice" || id.Role != auth.RoleOperate {
				t.Errorf("the file does not let the printed token in as alice (operate): %+v %v", id, ok)
			}
		})
	}
}

// TestTokenNewBadName: a name the tokens file cannot hold is refused
// before a token is made.
func TestTokenNewBadName(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"token", "new", "al ice: {x", "--role", "read"}, &stdout, &stderr); code == 0 {
		t.Fatalf("exit 0, want a usage error; stdout %q", stdout.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("a token was printed: %q", stdout.String())
	}
}
