package config

import (
	"math/big"
	"strings"
	"testing"
)

func TestEntryNameRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		yamlKey string // as written in the file
		wantErr string // "" = accepted
	}{
		{name: "plain", yamlKey: "nightly-report"},
		{name: "dots and colons", yamlKey: "app.tasks:cleanup v2"},
		{name: "unicode", yamlKey: "rapport-quotidien-été"},
		{name: "inner space", yamlKey: "'two words'"},
		{name: "tab", yamlKey: `"a\tb"`, wantErr: "not printable"},
		{name: "newline", yamlKey: `"a\nb"`, wantErr: "not printable"},
		{name: "escape char", yamlKey: `"a\x1bb"`, wantErr: "not printable"},
		{name: "zero width space", yamlKey: `"a\u200bb"`, wantErr: "not printable"},
		{name: "slash", yamlKey: "a/b", wantErr: "must not contain '/'"},
		{name: "dot", yamlKey: "'.'", wantErr: "path elements"},
		{name: "dotdot", yamlKey: "'..'", wantErr: "path elements"},
		{name: "leading space", yamlKey: "' a'", wantErr: "start or end with a space"},
		{name: "empty", yamlKey: "''", wantErr: "non-empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := "entries:\n  " + tt.yamlKey + ": {task: t.x, every: 1m}\n"
			_, err := Parse("f.yaml", []byte(src))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("accepted %q", tt.yamlKey)
			case tt.wantErr != "" && (!strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "f.yaml:2:3: ")):
				t.Fatalf("error %q, want f.yaml:2:3: ... %q", err, tt.wantErr)
			}
		})
	}
}

// TestBigIntegersExact: integers beyond int64 stay exact, as Python's JSON
// keeps them, instead of turning into floats.
func TestBigIntegersExact(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("f.yaml", []byte(`entries:
  e:
    task: t.x
    every: 1m
    args: [123456789012345678901234567890, -99999999999999999999, 18446744073709551615, 18_446_744_073_709_551_616, 9223372036854775807, 1.5e30, 12345678901234567890123.0]
`))
	if err != nil {
		t.Fatal(err)
	}
	args := cfg.Entries[0].Args
	want := []string{"123456789012345678901234567890", "-99999999999999999999", "18446744073709551615", "18446744073709551616"}
	for i, w := range want {
		b, ok := args[i].(*big.Int)
		if !ok || b.String() != w {
			t.Errorf("arg %d = %#v, want exact %s", i, args[i], w)
		}
	}
	if v, ok := args[4].(int64); !ok || v != 9223372036854775807 {
		t.Errorf("max int64 = %#v, want int64", args[4])
	}
	for i := 5; i < 7; i++ {
		if _, ok := args[i].(float64); !ok {
			t.Errorf("arg %d = %#v, want a float (written as one)", i, args[i])
		}
	}
}
