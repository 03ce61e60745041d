package celery_test

import (
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// capturedSent is the task-sent event Celery 5.2.6 published for
// tasks.add.apply_async((1, 2), task_id='id-sent', expires=60) with
// task_send_sent_event (testdata: redis-cli PSUBSCRIBE output).
func capturedSent(t *testing.T) (channel string, msg []byte) {
	t.Helper()
	for _, m := range testutil.ReadPSubscribe(t, "testdata/task-sent-psubscribe.txt") {
		if strings.Contains(m.Channel, "celeryev") {
			return m.Channel, m.Payload
		}
	}
	t.Fatal("no task-sent event in the capture")
	return "", nil
}

// TestSentEventAsCelery: beatd's task-sent event has Celery's envelope,
// properties and event fields, in Celery's order, with the values of the
// task it describes.
func TestSentEventAsCelery(t *testing.T) {
	_, want := capturedSent(t)
	task, err := celery.Compile(&celery.Spec{Name: "e", Task: "tasks.add", Args: []any{int64(1), int64(2)}, Options: celery.SendOptions{Expires: celery.Expiry{After: time.Minute}}},
		"beatd/test", "beatd@h", "")
	if err != nil {
		t.Fatal(err)
	}
	f := &celery.Fire{Task: task, Slot: time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)}
	task.AssignID(f)
	now := time.Date(2026, 12, 1, 15, 0, 0, 500_000_000, time.UTC)
	got := task.AppendSentEvent(nil, f, celery.SentEvent{Hostname: "beatd@h", PID: 42, Clock: 7, Now: now})

	if g, w := testutil.JSONKeys(t, got), testutil.JSONKeys(t, want); !reflect.DeepEqual(g, w) {
		t.Errorf("envelope keys %v, Celery %v", g, w)
	}
	var ge, we map[string]any
	if err := json.Unmarshal(got, &ge); err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	_ = json.Unmarshal(want, &we)
	gp, wp := ge["properties"].(map[string]any), we["properties"].(map[string]any)
	delete(gp, "delivery_tag")
	delete(wp, "delivery_tag")
	if !reflect.DeepEqual(gp, wp) || ge["content-type"] != we["content-type"] || ge["content-encoding"] != we["content-encoding"] {
		t.Errorf("properties %v, Celery %v", gp, wp)
	}
	body := func(env map[string]any) []byte {
		b, err := base64.StdEncoding.DecodeString(env["body"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	gb, wb := body(ge), body(we)
	if g, w := testutil.JSONKeys(t, gb), testutil.JSONKeys(t, wb); !reflect.DeepEqual(g, w) {
		t.Errorf("event fields %v, Celery %v", g, w)
	}
	var ev map[string]any
	_ = json.Unmarshal(gb, &ev)
	id := string(f.ID[:])
	for k, v := range map[string]any{"type": "task-sent", "uuid": id, "root_id": id, "name": "tasks.add", "args": "[1, 2]", "kwargs": "{}",
		"queue": "celery", "exchange": "", "routing_key": "celery", "hostname": "beatd@h", "pid": 42.0, "clock": 7.0,
		"timestamp": 1796137200.5, "expires": "2026-12-01T15:01:00.500000+00:00"} {
		if ev[k] != v {
			t.Errorf("%s = %v, want %v", k, ev[k], v)
		}
	}
}
