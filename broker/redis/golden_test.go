package redis

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

type capture struct {
	Call  string `json:"call"`
	Redis map[string]struct {
		Type   string            `json:"type"`
		Values []json.RawMessage `json:"values"`
	} `json:"redis"`
}

func loadCapture(t *testing.T, name string) capture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "celery-wire", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var c capture
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// compareMessage checks one message beatd pushed against one Celery wrote.
func compareMessage(t *testing.T, got, want json.RawMessage, argsTuple bool) {
	t.Helper()
	testutil.CompareKombuEnvelope(t, got, want, argsTuple)
}

func entry(t *testing.T, yaml string) *config.Entry {
	t.Helper()
	cfg, err := config.Parse("golden.yaml", []byte("entries:\n  e:\n"+yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Entries[0]
}

// redisDump lists every key but beatd's own, as the capture script does.
func redisDump(t *testing.T, c *redis.Client) map[string][]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, k := range keys {
		if strings.HasPrefix(k, "beatd:") {
			continue
		}
		switch c.Type(ctx, k).Val() {
		case "list":
			vals := c.LRange(ctx, k, 0, -1).Val()
			slices.Reverse(vals) // oldest first
			out[k] = vals
		case "set":
			vals := c.SMembers(ctx, k).Val()
			sort.Strings(vals)
			out[k] = vals
		}
	}
	return out
}

func TestGoldenAgainstCelery(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	client := rs.Client()
	tests := []struct {
		capture   string
		entries   []string // entry YAML, one fire each, in capture order
		argsTuple bool
		bindings  bool // compare binding sets too (queue Celery auto-created)
	}{
		{capture: "plain", entries: []string{"    {task: tasks.add, every: 1s, args: [2, 3]}"}, argsTuple: true, bindings: true},
		{capture: "beat_sent", bindings: true, entries: []string{
			"    {task: tasks.add, every: 2s, args: [2, 3]}",
			"    {task: tasks.add, every: 2s, args: [2, 3]}",
			"    {task: tasks.hello, crontab: {minute: '*'}, kwargs: {who: beat}, options: {queue: reports, expires: 30, priority: 5}}"}},
		{capture: "custom_headers", entries: []string{"    {task: tasks.add, every: 1s, args: [5, 5], options: {headers: {x-tenant: acme}}}"}, argsTuple: true, bindings: true},
		{capture: "expires_seconds", entries: []string{"    {task: tasks.add, every: 1s, args: [1, 1], options: {expires: 120}}"}, argsTuple: true, bindings: true},
		{capture: "kwargs_unicode", entries: []string{"    {task: tasks.hello, every: 1s, kwargs: {who: \"Zoë ☃\"}}"}, bindings: true},
		{capture: "priority1", entries: []string{"    {task: tasks.add, every: 1s, args: [1, 1], options: {priority: 1}}"}, argsTuple: true, bindings: true},
		{capture: "send_task_by_name", entries: []string{"    {task: remote.only.task, every: 1s, args: [1], kwargs: {a: [1, 2, {b: null}]}}"}, bindings: true},
		// These captures' app declared its queues (task_queues), which beatd
		// cannot know, so only the messages are compared.
		{capture: "priority9", entries: []string{"    {task: tasks.add, every: 1s, args: [1, 1], options: {queue: reports, priority: 9}}"}, argsTuple: true},
		{capture: "queue", entries: []string{"    {task: tasks.add, every: 1s, args: [1, 1], options: {queue: reports}}"}, argsTuple: true},
		{capture: "queue_emails", entries: []string{"    {task: tasks.add, every: 1s, args: [4, 4], options: {queue: emails}}"}, argsTuple: true},
	}
	for _, tt := range tests {
		t.Run(tt.capture, func(t *testing.T) {
			ctx := context.Background()
			if err := client.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			p := New(client, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:"})
			slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
			for i, y := range tt.entries {
				task, err := celery.Compile(entry(t, y).Spec(), "beatd/test", "beatd@vm", "")
				if err != nil {
					t.Fatal(err)
				}
				res := make([]broker.Result, 1)
				fires := []celery.Fire{{Task: task, Slot: slot.Add(time.Duration(i) * time.Second)}}
				if err := p.Publish(ctx, 7, fires, res); err != nil || res[0] != broker.ResultOK {
					t.Fatalf("publish: %v %v", res, err)
				}
			}
			want := loadCapture(t, tt.capture)
			got := redisDump(t, client)
			for key, w := range want.Redis {
				g, ok := got[key]
				if w.Type == "set" {
					if !tt.bindings {
						continue
					}
					var members []string
					for _, v := range w.Values {
						var s string
						_ = json.Unmarshal(v, &s)
						members = append(members, s)
					}
					if !reflect.DeepEqual(g, members) {
						t.Errorf("binding %q = %q, Celery %q", key, g, members)
					}
					continue
				}
				if !ok || len(g) != len(w.Values) {
					t.Errorf("list %q has %d messages, Celery %d (keys: %v)", key, len(g), len(w.Values), keysOf(got))
					continue
				}
				for i := range g {
					compareMessage(t, json.RawMessage(g[i]), w.Values[i], tt.argsTuple)
				}
			}
		})
	}
}

func keysOf(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
