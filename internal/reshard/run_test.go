package reshard

import (
	"testing"
	"time"
)

// TestRunString: the one rendering of a resize, which `beatd shards show`
// and a parked replica's /status print.
func TestRunString(t *testing.T) {
	since := time.Date(2026, 12, 5, 18, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		run  Run
		want string
	}{
		{Run{From: 2, To: 4, Since: since, By: "host pid 7", Running: true}, "2 -> 4 since 2026-12-05T18:00:00Z by host pid 7, running"},
		{Run{From: 8, To: 1, Since: since, By: "h pid 1", Staged: true},
			"8 -> 1 since 2026-12-05T18:00:00Z by h pid 1, unfinished (its process is gone): rerun `beatd shards resize 1`"},
	} {
		if got := tc.run.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.run, got, tc.want)
		}
	}
}
