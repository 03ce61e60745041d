package migrate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

// TestRedBeatImport reads RedBeat's hashes from a real Redis. The fixture
// is written in RedBeat's encoding (RedBeatJSONEncoder: "__type__"-tagged
// crontab, interval, rrule and datetime objects), as RedBeat stores it.
func TestRedBeatImport(t *testing.T) {
	r := testutil.MustStartRedis(t)
	cli := r.Client()
	ctx := context.Background()
	fixture := map[string]map[string]string{
		"redbeat:nightly": {
			"definition": `{"name": "nightly", "task": "tasks.nightly", "schedule": {"__type__": "crontab", "minute": 0, "hour": "3", "day_of_week": "*", "day_of_month": "*", "month_of_year": "*"}, "args": [1], "kwargs": {"k": "v"}, "options": {"queue": "night", "expires": 600}, "enabled": true}`,
			"meta":       `{"last_run_at": {"__type__": "datetime", "year": 2026, "month": 11, "day": 30, "hour": 3, "minute": 0, "second": 0, "microsecond": 512000, "timezone": "UTC"}, "total_run_count": 9}`,
		},
		"redbeat:tick": {
			"definition": `{"name": "tick", "task": "tasks.tick", "schedule": {"__type__": "interval", "every": 10.0, "relative": false}, "args": [], "kwargs": {}, "options": {}, "enabled": true}`,
			"meta":       `{"last_run_at": {"__type__": "datetime", "year": 2026, "month": 11, "day": 30, "hour": 10, "minute": 59, "second": 55, "microsecond": 250000, "timezone": "Europe/Berlin"}, "total_run_count": 1000}`,
		},
		"redbeat:off": {
			"definition": `{"name": "off", "task": "tasks.off", "schedule": {"__type__": "interval", "every": 3600.0, "relative": true}, "args": [], "kwargs": {}, "options": {}, "enabled": false}`,
		},
		"redbeat:rule": {
			"definition": `{"name": "rule", "task": "tasks.rule", "schedule": {"__type__": "rrule", "freq": 3, "interval": 1, "dtstart": 1764460800, "dtstart_tz": 0}, "args": [], "kwargs": {}, "options": {}, "enabled": true}`,
		},
	}
	for k, h := range fixture {
		if err := cli.HSet(ctx, k, h).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// RedBeat's own bookkeeping keys are not entries.
	cli.ZAdd(ctx, "redbeat::schedule", redis.Z{Score: 1, Member: "redbeat:tick"})
	cli.Set(ctx, "redbeat::lock", "x", 0)
	cli.HSet(ctx, "other:hash", "definition", "{}")

	src, err := Load(ctx, r.URL(0), "redbeat:")
	if err != nil {
		t.Fatal(err)
	}
	if src.Kind != "redbeat" || len(src.Entries) != 4 {
		t.Fatalf("source %s with %d entries", src.Kind, len(src.Entries))
	}
	res, err := Convert(src, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(res.Skipped, ",") != "rule" || !strings.Contains(strings.Join(res.Warnings, "\n"), `entry "rule": not imported`) {
		t.Errorf("skipped %v, warnings %v", res.Skipped, res.Warnings)
	}
	for _, want := range []string{
		"  \"nightly\":\n    task: \"tasks.nightly\"\n    crontab: {minute: \"0\", hour: \"3\", day_of_week: \"*\", day_of_month: \"*\", month_of_year: \"*\"}\n    args: [1]\n    kwargs: {\"k\": \"v\"}\n    options: {queue: \"night\", expires: 600}",
		"  \"tick\":\n    task: \"tasks.tick\"\n    every: 10s\n    start_at: \"2026-11-30T09:59:55.25Z\"",
		"  \"off\":\n    task: \"tasks.off\"\n    every: 1h\n    relative: true\n    enabled: false",
	} {
		if !strings.Contains(res.YAML, want) {
			t.Errorf("YAML lacks %q:\n%s", want, res.YAML)
		}
	}
	got := map[string]time.Time{}
	for _, s := range res.States {
		got[s.Name] = s.LastSlot
	}
	if !got["nightly"].Equal(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)) || !got["tick"].Equal(time.Date(2026, 11, 30, 9, 59, 55, 250e6, time.UTC)) || len(got) != 2 {
		t.Errorf("states %v", got)
	}
}
