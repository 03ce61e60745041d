package daemon

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMinIntervalFlag: --min-interval is checked with run's other flags,
// and the file (and through it every runtime entry) is read with it.
func TestMinIntervalFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(file, []byte("entries:\n  fast: {task: t, every: 10ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		flagErr string // from ParseFlags
		loadErr string // from loadConfig; "" is loaded
	}{
		{name: "default", loadErr: "every: 10ms is below the minimum interval, 100ms"},
		{name: "lowered", args: []string{"--min-interval", "10ms"}},
		{name: "too low", args: []string{"--min-interval", "100us"}, flagErr: "--min-interval: config: the minimum interval must be between 1ms and 1s"},
		{name: "too high", args: []string{"--min-interval", "1m"}, flagErr: "must be between 1ms and 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := newTestMain(io.Discard, io.Discard)
			err := m.ParseFlags(context.Background(), append([]string{"--config", file}, tt.args...))
			if tt.flagErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.flagErr) {
					t.Fatalf("ParseFlags: %v, want %q", err, tt.flagErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := m.loadConfig()
			if tt.loadErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.loadErr) {
					t.Fatalf("loadConfig: %v, want %q", err, tt.loadErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cfg.ParseEntry("api", []byte(`{"task":"t","every":"10ms"}`)); err != nil {
				t.Errorf("a runtime entry under the file's config: %v", err)
			}
		})
	}
}
