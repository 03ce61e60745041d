package main

import (
	"bytes"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestApplyInput checks the forms beatd entries apply reads and the JSON
// it sends (key order kept).
func TestApplyInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want, out, err string
	}{
		{name: "entries mapping", in: "entries:\n  a: {task: t, every: 1s, kwargs: {z: 1, a: 2.5, s: '07', n: null, b: true}}\n",
			want: `{"a":{"task":"t","every":"1s","kwargs":{"z":1,"a":2.5,"s":"07","n":null,"b":true}}}`},
		{name: "numbers keep their type", in: "entries:\n  a: {task: t, every: 1s, args: [1.0, 2.5e2, 123456789012345678901234567890, -0.0, 0x1F, '1.0']}\n",
			want: `{"a":{"task":"t","every":"1s","args":[1.0,250.0,123456789012345678901234567890,-0.0,31,"1.0"]}}`},
		{name: "get -o yaml", in: "name: a\nsource: api\nactive: true\nspec:\n  task: t\n  every: 1s\nmod_revision: 5\n",
			want: `{"a":{"task":"t","every":"1s"}}`},
		{name: "list -o yaml", in: "entries:\n  - name: f\n    source: file\n  - name: a\n    source: api\n    spec: {task: t, cron: '* * * * *'}\n",
			want: `{"a":{"task":"t","cron":"* * * * *"}}`, out: "entry f skipped: source file is not written through the API"},
		{name: "defaults refused", in: "defaults: {catchup: all}\nentries: {}\n", err: "only entries is allowed"},
		{name: "no entries", in: "entries: 3\n", err: "must be a mapping"},
		{name: "not a mapping", in: "- 1\n", err: "want a mapping"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc yaml.Node
			if err := yaml.Unmarshal([]byte(tt.in), &doc); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			n, err := entriesNode(&out, "f.yaml", doc.Content[0])
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := nodeJSON(n, 0)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("JSON %s\nwant %s", got, tt.want)
			}
			if !strings.Contains(out.String(), tt.out) {
				t.Errorf("output %q, want %q", out.String(), tt.out)
			}
		})
	}
}

// TestPrintYAMLKeepsValues checks that YAML output reads back as the same
// JSON values, strings that look like other things included.
func TestPrintYAMLKeepsValues(t *testing.T) {
	t.Parallel()
	in := map[string]any{"s": []any{"07", "~", "true", "null", "1s", "", "2026-01-01T00:00:00Z", "0x1F", "yes", "1e3"}, "n": []any{7, 2.5, true, nil}}
	var buf bytes.Buffer
	if err := printYAML(&buf, in); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := yaml.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	for i, want := range in["s"].([]any) {
		if got := back["s"].([]any)[i]; got != want {
			t.Errorf("string %q came back as %#v\n%s", want, got, buf.String())
		}
	}
	if strings.Contains(buf.String(), "{") {
		t.Errorf("flow style left:\n%s", buf.String())
	}
}
