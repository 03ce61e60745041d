package sqs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/testutil"
)

// capture is one file of testdata/celery-wire-sqs, written by its
// capture.py: Celery 5.2.6 and Kombu 5.2.4's SQS transport (boto3)
// sending to the emulator.
type capture struct {
	Call   string `json:"call"`
	Prefix string `json:"prefix"`
	Queues map[string][]struct {
		Body       string            `json:"body"`
		Envelope   json.RawMessage   `json:"envelope"`
		MessageAtt map[string]any    `json:"message_attributes"`
		Attributes map[string]string `json:"attributes"`
	} `json:"queues"`
	SendMessage []map[string]string `json:"send_message"`
}

func loadCapture(t *testing.T, name string) capture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "celery-wire-sqs", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var c capture
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func compile(t testing.TB, yaml string) *celery.Task {
	t.Helper()
	cfg, err := config.Parse("golden.yaml", []byte("entries:\n  e:\n"+yaml))
	if err != nil {
		t.Fatal(err)
	}
	task, err := celery.Compile(cfg.Entries[0].Spec(), "beatd/test", "beatd@vm", "")
	if err != nil {
		t.Fatal(err)
	}
	return task
}

// TestGoldenAgainstKombu sends what each capture's Celery call sent and
// compares, message by message, what reached the emulator: the queue
// (Kombu's name mapping and prefix), the body (base64 of Kombu's
// envelope), no message attributes, and SendMessage's parameters.
func TestGoldenAgainstKombu(t *testing.T) {
	e := sharedSQS(t)
	tests := []struct {
		capture   string
		entry     string
		argsTuple bool
	}{
		{capture: "plain", entry: "    {task: tasks.add, every: 1s, args: [2, 3]}", argsTuple: true},
		{capture: "dotted_queue", entry: "    {task: tasks.hello, every: 1s, kwargs: {who: beat}, options: {queue: reports.daily, expires: 30}}"},
		{capture: "fifo", entry: "    {task: tasks.add, every: 1s, args: [1, 2], options: {queue: jobs.fifo}}", argsTuple: true},
		{capture: "prefixed", entry: "    {task: tasks.add, every: 1s, args: [4, 5], options: {queue: reports.daily}}", argsTuple: true},
		{capture: "priority", entry: "    {task: tasks.add, every: 1s, args: [1, 1], options: {priority: 5}}", argsTuple: true},
	}
	for _, tt := range tests {
		t.Run(tt.capture, func(t *testing.T) {
			want := loadCapture(t, tt.capture)
			if len(want.Queues) != 1 || len(want.SendMessage) != 1 {
				t.Fatalf("capture has %d queues and %d sends, want 1", len(want.Queues), len(want.SendMessage))
			}
			// Each case gets prefixes of its own, so the emulator's queues
			// of other cases never meet it; the capture's own prefix
			// comes after ours, as Kombu would apply a longer one.
			c := newCluster(t)
			own := uniq("g") + "-"
			s := c.dispatcher(e, "queue_name_prefix="+own+want.Prefix)
			token := c.elect("a")
			ctx := context.Background()
			if err := s.RaiseFence(ctx, token); err != nil {
				t.Fatal(err)
			}
			fires := []celery.Fire{{Task: compile(t, tt.entry), Slot: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}}
			res := make([]broker.Result, 1)
			if err := s.Publish(ctx, token, fires, res); err != nil || res[0] != broker.ResultOK {
				t.Fatalf("publish: %v %v", res, err)
			}
			for queue, msgs := range want.Queues {
				got := drain(t, e, own+queue)
				if len(got) != len(msgs) {
					t.Fatalf("queue %q has %d messages, Kombu sent %d", own+queue, len(got), len(msgs))
				}
				for i, g := range got {
					raw, err := base64.StdEncoding.DecodeString(g.Body)
					if err != nil {
						t.Fatalf("body is not base64 as Kombu's sqs_base64_encoding writes it: %v", err)
					}
					if _, err := base64.StdEncoding.DecodeString(msgs[i].Body); err != nil {
						t.Fatalf("the capture's body is not base64: %v", err)
					}
					testutil.CompareKombuEnvelope(t, raw, msgs[i].Envelope, tt.argsTuple)
					if len(msgs[i].MessageAtt) != 0 {
						t.Errorf("Kombu sent message attributes %v: compare them", msgs[i].MessageAtt)
					}
				}
			}
			// SendMessage's parameters beside the body and queue: on a
			// .fifo queue Kombu's MessageGroupId "default" and a
			// MessageDeduplicationId, which beatd makes the task id.
			kombu := want.SendMessage[0]
			m, err := s.message(ctx, &fires[0], 0, token, time.Now(), new([]byte))
			if err != nil {
				t.Fatal(err)
			}
			entry := sqsEntry(0, m)
			var gotKeys, wantKeys []string
			for k := range kombu {
				if k != "QueueUrl" && k != "QueueName" {
					wantKeys = append(wantKeys, k)
				}
			}
			if entry.MessageGroupId != nil {
				gotKeys = append(gotKeys, "MessageGroupId")
				if *entry.MessageGroupId != kombu["MessageGroupId"] {
					t.Errorf("MessageGroupId %q, Kombu %q", *entry.MessageGroupId, kombu["MessageGroupId"])
				}
			}
			if entry.MessageDeduplicationId != nil {
				gotKeys = append(gotKeys, "MessageDeduplicationId")
				if id := string(fires[0].ID[:]); *entry.MessageDeduplicationId != id {
					t.Errorf("MessageDeduplicationId %q, want the task id %q", *entry.MessageDeduplicationId, id)
				}
			}
			if entry.MessageAttributes != nil || entry.MessageSystemAttributes != nil || entry.DelaySeconds != 0 {
				t.Errorf("beatd sets parameters Kombu does not: %+v", entry)
			}
			slices.Sort(gotKeys)
			slices.Sort(wantKeys)
			if !reflect.DeepEqual(gotKeys, wantKeys) {
				t.Errorf("SendMessage parameters %v, Kombu %v", gotKeys, wantKeys)
			}
		})
	}
}

func TestEntityNameAsKombu(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"celery", "celery"},
		{"reports.daily", "reports-daily"},
		{"prod-reports.daily", "prod-reports-daily"},
		{"jobs.fifo", "jobs.fifo"},
		{"a.b.fifo", "a-b.fifo"},
		{"x:y/z@w", "x_y_z_w"},
		{"a-b_c", "a-b_c"},
		{"zoë", "zoë"},
	} {
		if got := EntityName(tt.in); got != tt.want {
			t.Errorf("EntityName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
