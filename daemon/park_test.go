package daemon

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestParkFlag: --park is wired like every run flag (BEATD_PARK when the
// flag is not given), and is refused where there is no embedded member
// to keep (--etcd-endpoints, as flag or environment), before anything
// starts.
func TestParkFlag(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		park bool
		err  string
	}{
		{name: "off by default"},
		{name: "flag", args: []string{"--park"}, park: true},
		{name: "environment", env: map[string]string{"BEATD_PARK": "true"}, park: true},
		{name: "flag over environment", args: []string{"--park=false"}, env: map[string]string{"BEATD_PARK": "true"}},
		{name: "not a bool", env: map[string]string{"BEATD_PARK": "maybe"}, err: "BEATD_PARK"},
		{name: "with --etcd-endpoints", args: []string{"--park", "--etcd-endpoints", "http://127.0.0.1:2379"},
			err: "--park keeps this replica's embedded etcd member running while the cluster is stopped for a resize; with --etcd-endpoints it has no member to keep"},
		{name: "with BEATD_ETCD_ENDPOINTS", env: map[string]string{"BEATD_PARK": "1", "BEATD_ETCD_ENDPOINTS": "http://127.0.0.1:2379"},
			err: "with --etcd-endpoints it has no member to keep"},
		{name: "with --shards", args: []string{"--park", "--shards", "8"}, park: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			m := newTestMain(io.Discard, io.Discard)
			err := m.ParseFlags(context.Background(), tt.args)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseFlags: %v, want an error saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Park != tt.park {
				t.Errorf("Park = %v, want %v", m.Park, tt.park)
			}
		})
	}
}
