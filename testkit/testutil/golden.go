package testutil

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// randomProps are the Kombu properties that differ between any two
// messages.
var randomProps = []string{"correlation_id", "reply_to", "delivery_tag"}

// CompareKombuEnvelope checks one Kombu envelope (the JSON a virtual
// transport writes: Redis's list element, SQS's decoded body) that beatd
// sent against one Celery 5.2.6 wrote; argsTuple says Python sent the args
// as a tuple. Every virtual transport's golden test holds beatd to it.
func CompareKombuEnvelope(t testing.TB, got, want json.RawMessage, argsTuple bool) {
	t.Helper()
	var g, w map[string]any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("beatd message is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	delete(w, "_decoded_body")
	if gk, wk := JSONKeys(t, got), slices.DeleteFunc(JSONKeys(t, want), func(k string) bool { return k == "_decoded_body" }); !reflect.DeepEqual(gk, wk) {
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
	for _, k := range JSONKeys(t, RawField(t, got, "headers")) {
		if !slices.Contains(GoldenBeatdHeaders, k) {
			gOrder = append(gOrder, k)
		}
	}
	wOrder := JSONKeys(t, RawField(t, want, "headers"))
	if !reflect.DeepEqual(gOrder, wOrder) {
		t.Errorf("header order\n got %v\nwant %v", gOrder, wOrder)
	}
	for _, k := range GoldenVaryingHeaders {
		delete(gh, k)
		delete(wh, k)
	}
	for _, k := range GoldenBeatdHeaders {
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
	wk := JSONKeys(t, RawField(t, want, "properties"))
	if i := slices.Index(wk, "reply_to"); i >= 0 {
		wk = slices.Insert(wk, i+1, "periodic_task_name")
	}
	if gk := JSONKeys(t, RawField(t, got, "properties")); !reflect.DeepEqual(gk, wk) {
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

// RawField returns the raw JSON of obj[key], preserving key order.
func RawField(t testing.TB, obj json.RawMessage, key string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obj, &m); err != nil {
		t.Fatal(err)
	}
	return m[key]
}
