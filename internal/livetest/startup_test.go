package livetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestRunRejectsABadConfigBeforeStarting: `beatd run` checks its config
// file as `beatd validate` does, before it starts the embedded etcd or any
// listener, prints the same FILE:LINE:COL lines and exits 1.
func TestRunRejectsABadConfigBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, config string
		want         []string
	}{
		{name: "parse errors", config: "entries:\n  a: {task: t, every: nope}\n  b: {every: 1s}\n",
			want: []string{":2:23: every: \"nope\" is not a duration", ":3:3: entry \"b\": missing key task"}},
		{name: "unreadable", config: "", want: []string{"read config"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			config := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if tc.config != "" {
				if err := os.WriteFile(config, []byte(tc.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			data := filepath.Join(dir, "data-"+strings.ReplaceAll(tc.name, " ", "-"))
			out := failsAtStart(t, nil, "--config", config, "--data-dir", data,
				"--etcd-client-port", strconv.Itoa(testutil.FreePort(t)), "--etcd-peer-port", strconv.Itoa(testutil.FreePort(t)))
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			// Each problem on a line of its own, as validate prints them.
			if tc.name == "parse errors" {
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					if !strings.HasPrefix(l, config+":") {
						t.Errorf("line %q is not FILE:LINE:COL: message", l)
					}
				}
			}
			for _, bad := range []string{`"msg"`, "server has been stopped", "embedded"} {
				if strings.Contains(out, bad) {
					t.Errorf("output has %q: something started before the config was checked:\n%s", bad, out)
				}
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				t.Errorf("the data dir was made (%v): etcd started before the config was checked", err)
			}
		})
	}
}
