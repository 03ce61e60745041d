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

// randomProps are the Kombu properties that differ between any two
// messages.
var randomProps = []string{"correlation_id", "reply_to", "delivery_tag"}

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
	var g, w map[string]any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("beatd message is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	delete(w, "_decoded_body")
	if gk, wk := testutil.JSONKeys(t, got), slices.DeleteFunc(testutil.JSONKeys(t, want), func(k string) bool { return k == "_decoded_body" }); !reflect.DeepEqual(gk, wk) {
		t.Errorf("envelope keys %v, Celery %v", gk, wk)
	}
	gh, wh := g["headers"].(map[string]any), w["headers"].(map[string]any)
	gp, wp := g["properties"].(map[string]any), w["properties"].(map[string]any)
	entry := gh["beat_entry"]
	// Identity: id == root_id == correlation_id.
	if gh["id"] != gh["root_id"] || gh["id"] != gp["correlation_id"] {
		t.Errorf("id %v, root_id %v, correlation_id %v differ", gh["id"], gh["root_id"], gp["correlation_id"])
	}
	if (wh["expires"] == nil) != (gh["expires"] == nil) {
		t.Errorf("expires %v, Celery %v", gh["expires"], wh["expires"])
	}
	if s, ok := gh["expires"].(string); ok {
		if _, err := time.Parse("2006-01-02T15:04:05.999999-07:00", s); err != nil || strings.HasSuffix(s, "Z") {
			t.Errorf("expires %q is not Python isoformat", s)
		}
	}
	if !strings.HasPrefix(gh["origin"].(string), "beatd@") {
		t.Errorf("origin = %v", gh["origin"])
	}
	// Header order: Celery's keys in Celery's order, then beatd's additions.
	var gOrder []string
	for _, k := range testutil.JSONKeys(t, rawField(t, got, "headers")) {
		if !slices.Contains(testutil.GoldenBeatdHeaders, k) {
			gOrder = append(gOrder, k)
		}
	}
	wOrder := testutil.JSONKeys(t, rawField(t, want, "headers"))
	if !reflect.DeepEqual(gOrder, wOrder) {
		t.Errorf("header order\n got %v\nwant %v", gOrder, wOrder)
	}
	for _, k := range testutil.GoldenVaryingHeaders {
		delete(gh, k)
		delete(wh, k)
	}
	for _, k := range testutil.GoldenBeatdHeaders {
		delete(gh, k)
	}
	if argsTuple { // Python sent a tuple; beat always sends a list.
		wh["argsrepr"] = "[" + strings.TrimSuffix(strings.TrimPrefix(wh["argsrepr"].(string), "("), ")") + "]"
	}
	if !reflect.DeepEqual(gh, wh) {
		t.Errorf("headers\n got %v\nwant %v", gh, wh)
	}
	// beatd sends periodic_task_name as django-celery-beat does: Celery
	// 5.2.6 puts that send option right after reply_to (captured from
	// apply_async(..., periodic_task_name=...)).
	wk := testutil.JSONKeys(t, rawField(t, want, "properties"))
	if i := slices.Index(wk, "reply_to"); i >= 0 {
		wk = slices.Insert(wk, i+1, "periodic_task_name")
	}
	if gk := testutil.JSONKeys(t, rawField(t, got, "properties")); !reflect.DeepEqual(gk, wk) {
		t.Errorf("property order %v, want %v", gk, wk)
	}
	if gp["periodic_task_name"] != entry || entry == nil {
		t.Errorf("periodic_task_name %v, entry %v", gp["periodic_task_name"], entry)
	}
	delete(gp, "periodic_task_name")
	for _, k := range randomProps {
		delete(gp, k)
		delete(wp, k)
	}
	if !reflect.DeepEqual(gp, wp) {
		t.Errorf("properties\n got %v\nwant %v", gp, wp)
	}
	for _, k := range []string{"body", "content-encoding", "content-type"} {
		if g[k] != w[k] {
			t.Errorf("%s = %v, Celery %v", k, g[k], w[k])
		}
	}
}

// rawField returns the raw JSON of obj[key], preserving key order.
func rawField(t *testing.T, obj json.RawMessage, key string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obj, &m); err != nil {
		t.Fatal(err)
	}
	return m[key]
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
