package celery_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
)

// TestLateFireExpires: a Late fire's message, on Redis and on AMQP and in
// its task-sent event, expires at the earlier of the entry's expires and
// late_slot_expires after the publish; a fire that is not late keeps the
// entry's own.
func TestLateFireExpires(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		opt        celery.SendOptions
		late       bool
		expires    any    // the header, as JSON decodes it
		expiration string // the TTL in ms, "" for none
	}{
		{"on time, no expires", celery.SendOptions{LateExpires: 2 * time.Minute}, false, nil, ""},
		{"late, no expires", celery.SendOptions{LateExpires: 2 * time.Minute}, true, "2026-12-01T10:02:00+00:00", "120000"},
		{"late, own earlier", celery.SendOptions{LateExpires: 2 * time.Minute, Expires: celery.Expiry{After: time.Minute}}, true, "2026-12-01T10:01:00+00:00", "60000"},
		{"late, own later", celery.SendOptions{LateExpires: 2 * time.Minute, Expires: celery.Expiry{At: now.Add(time.Hour)}}, true, "2026-12-01T10:02:00+00:00", "120000"},
		{"late without late_slot_expires", celery.SendOptions{Expires: celery.Expiry{After: time.Hour}}, true, "2026-12-01T11:00:00+00:00", "3600000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task, err := celery.Compile(&celery.Spec{Name: "e", Task: "tasks.add", Options: tt.opt}, "beatd/test", "beatd@test", "")
			if err != nil {
				t.Fatal(err)
			}
			f := &celery.Fire{Task: task, Slot: now.Add(-time.Hour), Late: tt.late}
			var m struct {
				Headers    map[string]any `json:"headers"`
				Properties map[string]any `json:"properties"`
			}
			if err := json.Unmarshal(task.AppendMessage(nil, f, 7, now), &m); err != nil {
				t.Fatal(err)
			}
			if got := m.Headers["expires"]; got != tt.expires {
				t.Errorf("redis: expires %v, want %v", got, tt.expires)
			}
			if got, _ := m.Properties["expiration"].(string); got != tt.expiration {
				t.Errorf("redis: expiration %q, want %q", got, tt.expiration)
			}
			am := task.AMQPMessage(f, 7, now)
			if am.Expiration != tt.expiration {
				t.Errorf("amqp: expiration %q, want %q", am.Expiration, tt.expiration)
			}
			for _, h := range am.Headers {
				if h.Key == "expires" && h.Value != tt.expires {
					t.Errorf("amqp: expires %v, want %v", h.Value, tt.expires)
				}
			}
		})
	}
}
