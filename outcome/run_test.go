package outcome

import (
	"encoding/json"
	"testing"
	"time"
)

// TestRunJSON: the API's recent runs keep the broker's run record's JSON
// (slot, published_at, token, task_id, manual, backfill) whatever the
// state's outcome fields hold.
func TestRunJSON(t *testing.T) {
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		run  Run
		want string
	}{
		{"scheduled", Run{Slot: at, PublishedAt: at.Add(time.Millisecond), Token: 7, TaskID: "t1"},
			`{"slot":"2026-12-05T10:00:00Z","published_at":"2026-12-05T10:00:00.001Z","token":7,"task_id":"t1"}`},
		{"manual backfill", Run{Slot: at, PublishedAt: at, Token: 7, TaskID: "t2", Manual: true, Backfill: true},
			`{"slot":"2026-12-05T10:00:00Z","published_at":"2026-12-05T10:00:00Z","token":7,"task_id":"t2","manual":true,"backfill":true}`},
		{"with outcome", Run{Slot: at, PublishedAt: at, TaskID: "t3", Kind: Failed, Updated: at, Started: at, Runtime: time.Second,
			Worker: "celery@w", ExcType: "E", ExcMsg: "m", Skips: 2},
			`{"slot":"2026-12-05T10:00:00Z","published_at":"2026-12-05T10:00:00Z","token":0,"task_id":"t3"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.run)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got  %s\nwant %s", b, tc.want)
			}
		})
	}
}
