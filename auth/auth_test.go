package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	h := Hash("x")
	for _, tt := range []struct{ name, file, want string }{
		{"plain token", "tokens:\n  a: {role: read, sha256: hunter2}\n", "t.yaml:2:27: token \"a\": sha256 must be 64 hex digits"},
		{"unknown role", "tokens:\n  a: {role: root, sha256: " + h + "}\n", "t.yaml:2:13: token \"a\": unknown role \"root\""},
		{"no role", "tokens:\n  a: {sha256: " + h + "}\n", "t.yaml:2:6: token \"a\": role is missing"},
		{"unknown key", "tokens:\n  a: {role: read, sha256: " + h + ", ttl: 1}\n", "unknown key \"ttl\""},
		{"bad name", "tokens:\n  'a b': {role: read, sha256: " + h + "}\n", "t.yaml:2:3: token name \"a b\""},
		{"same hash twice", "tokens:\n  a: {role: read, sha256: " + h + "}\n  b: {role: admin, sha256: " + h + "}\n", "same hash as \"a\""},
		{"top-level key", "token:\n  a: {}\n", "t.yaml:1:1: unknown key \"token\""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("t.yaml", []byte(tt.file))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestReload checks that a changed file is read on use, and that a bad
// change keeps the tokens read before.
func TestReload(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(body string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	write("tokens:\n  alice: {role: operate, sha256: "+Hash("a-tok")+"}\n", now)
	tk, err := New(Options{File: p, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := tk.Who("a-tok"); !ok || id != (Identity{"alice", RoleOperate}) {
		t.Fatalf("alice = %+v %v", id, ok)
	}
	if _, ok := tk.Who("b-tok"); ok {
		t.Fatal("unknown token accepted")
	}
	// Revoke alice, add bob.
	write("tokens:\n  bob: {role: read, sha256: "+Hash("b-tok")+"}\n", now.Add(time.Minute))
	now = now.Add(2 * time.Second)
	if _, ok := tk.Who("a-tok"); ok {
		t.Error("a revoked token still works")
	}
	if id, ok := tk.Who("b-tok"); !ok || id.Name != "bob" {
		t.Errorf("bob = %+v %v", id, ok)
	}
	// A broken file keeps bob, and says why.
	write("tokens: [\n", now.Add(2*time.Minute))
	now = now.Add(2 * time.Second)
	if _, ok := tk.Who("b-tok"); !ok {
		t.Error("a bad reload dropped the tokens in use")
	}
	if err := tk.LoadError(); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("LoadError = %v", err)
	}
}

func TestBuiltins(t *testing.T) {
	t.Parallel()
	tk, err := New(Options{Admin: "adm", Read: "rd"})
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := tk.Who("adm"); id != (Identity{AdminName, RoleAdmin}) {
		t.Errorf("admin token = %+v", id)
	}
	if id, _ := tk.Who("rd"); id != (Identity{ReadName, RoleRead}) {
		t.Errorf("read token = %+v", id)
	}
	if !tk.Guarded() || !tk.Enabled() {
		t.Error("a read token guards reads")
	}
	none, _ := New(Options{})
	if none.Enabled() || none.Guarded() {
		t.Error("no tokens: nothing enabled")
	}
	if !strings.HasPrefix(NewToken(), "bt_") || NewToken() == NewToken() {
		t.Error("NewToken")
	}
}
