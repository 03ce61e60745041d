package celery_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/google/uuid"
)

// canvasCapture is the body and properties real Celery 5.2.6 LPUSHed for
// one call (testdata/canvas/capture.py made them).
func canvasCapture(t *testing.T, name string) (body []byte, props map[string]any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "canvas", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var capture struct {
		Redis map[string]struct {
			Type   string
			Values []json.RawMessage
		}
	}
	if err := json.Unmarshal(data, &capture); err != nil {
		t.Fatal(err)
	}
	q := capture.Redis["celery"]
	if len(q.Values) != 1 {
		t.Fatalf("%s: want one message in the celery queue, got %d", name, len(q.Values))
	}
	return envelopeBody(t, q.Values[0])
}

func envelopeBody(t *testing.T, msg []byte) ([]byte, map[string]any) {
	t.Helper()
	var env struct {
		Body       string
		Properties map[string]any
	}
	if err := json.Unmarshal(msg, &env); err != nil {
		t.Fatalf("%v: %s", err, msg)
	}
	b, err := base64.StdEncoding.DecodeString(env.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b, env.Properties
}

var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

func str(s string) *celery.Map { return &celery.Map{Keys: []string{"who"}, Values: []any{s}} }

// TestCanvasAsCelery: an entry's chain, link and link_error give the body
// Celery's chain(...).apply_async(link=..., link_error=...) and
// signature(...).set(link=..., link_error=...) give, byte for byte, but
// for the ids Celery draws at random: each chained step's task_id (beatd
// derives it from the message's id) and reply_to (the producer's oid,
// the same as the message's reply_to property).
func TestCanvasAsCelery(t *testing.T) {
	hello := func(who string) celery.Step {
		return celery.Step{Task: "tasks.hello", Kwargs: str(who), Immutable: true}
	}
	for _, tt := range []struct {
		capture string
		spec    celery.Spec
	}{
		{"chain3_link_error", celery.Spec{Task: "tasks.add", Args: []any{int64(2), int64(3)}, Options: celery.SendOptions{Canvas: &celery.Canvas{
			Chain: []celery.Step{
				{Task: "tasks.add", Args: []any{int64(10)}, Options: &celery.Map{Keys: []string{"queue", "priority"}, Values: []any{"reports", int64(5)}}},
				hello("done"),
			},
			LinkError: []celery.Step{hello("failed")},
		}}}},
		{"chain3_link", celery.Spec{Task: "tasks.add", Args: []any{int64(1), int64(2)}, Options: celery.SendOptions{Canvas: &celery.Canvas{
			Chain: []celery.Step{
				{Task: "tasks.add", Args: []any{int64(3)}},
				{Task: "tasks.add", Args: []any{int64(4)}, Kwargs: &celery.Map{}, Options: &celery.Map{Keys: []string{"queue"}, Values: []any{"reports"}}},
			},
			Link:      []celery.Step{hello("ok")},
			LinkError: []celery.Step{hello("e1"), {Task: "tasks.hello", Args: []any{"e2"}, Immutable: true}},
		}}}},
		{"chain2", celery.Spec{Task: "tasks.add", Args: []any{int64(1), int64(2)}, Options: celery.SendOptions{Canvas: &celery.Canvas{
			Chain: []celery.Step{{Task: "tasks.hello", Kwargs: str("x"), Options: &celery.Map{Keys: []string{"priority"}, Values: []any{int64(3)}}}},
		}}}},
		{"link", celery.Spec{Task: "tasks.add", Args: []any{int64(2), int64(3)}, Options: celery.SendOptions{Canvas: &celery.Canvas{
			Link:      []celery.Step{{Task: "tasks.hello", Kwargs: str("ok"), Options: &celery.Map{Keys: []string{"queue"}, Values: []any{"reports"}}, Immutable: true}},
			LinkError: []celery.Step{hello("err")},
		}}}},
	} {
		t.Run(tt.capture, func(t *testing.T) {
			want, _ := canvasCapture(t, tt.capture)
			spec := tt.spec
			spec.Name = "e"
			task, err := celery.Compile(&spec, "beatd/test", "beatd@h", "")
			if err != nil {
				t.Fatal(err)
			}
			slot := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
			f := &celery.Fire{Task: task, Slot: slot}
			msg := task.AppendMessage(nil, f, 1, slot)
			got, props := envelopeBody(t, msg)
			// The ids beatd chose are the step ids of this message, and
			// reply_to is the message's own.
			var ids []string
			for i := 1; i <= len(spec.Options.Canvas.Chain); i++ {
				id := celery.StepID(f.ID, i)
				ids = append([]string{string(id[:])}, ids...) // the chain is sent reversed
			}
			var gotIDs []string
			// reply_to is the cluster's, not the process's, so that another
			// leader renders the same body: UUIDv5 of "<cluster>/reply_to".
			clusterReply := uuid.NewSHA1(uuid.MustParse("0f679077-44ce-532c-9c82-f906c94d7265"), []byte("beatd/test/reply_to")).String()
			if props["reply_to"] != clusterReply {
				t.Errorf("message reply_to %v, want the cluster's %s", props["reply_to"], clusterReply)
			}
			for _, m := range regexp.MustCompile(`"task_id": "([^"]+)", "reply_to": "([^"]+)"`).FindAllSubmatch(got, -1) {
				gotIDs = append(gotIDs, string(m[1]))
				if string(m[2]) != clusterReply {
					t.Errorf("step reply_to %s, want the cluster's %s", m[2], clusterReply)
				}
			}
			if len(ids) > 0 && !equal(gotIDs, ids) {
				t.Errorf("step task ids %v, want %v", gotIDs, ids)
			}
			g, w := uuidRE.ReplaceAll(got, []byte("<uuid>")), uuidRE.ReplaceAll(want, []byte("<uuid>"))
			if !bytes.Equal(g, w) {
				t.Errorf("body differs from Celery's\n beatd:  %s\n celery: %s", g, w)
			}
			// The AMQP transport sends the same body and reply_to.
			if m := task.AMQPMessage(f, 1, slot); !bytes.Equal(m.Body, got) || m.ReplyTo != clusterReply {
				t.Errorf("AMQP body or reply_to differs from Redis's:\n%s\n%s (reply_to %s)", m.Body, got, m.ReplyTo)
			}
			// The same slot renders the same body: a re-publish is identical.
			again, _ := envelopeBody(t, task.AppendMessage(nil, &celery.Fire{Task: task, Slot: slot}, 2, slot.Add(time.Hour)))
			if !bytes.Equal(again, got) {
				t.Errorf("the same slot rendered two bodies:\n%s\n%s", got, again)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
