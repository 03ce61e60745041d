package migrate

import (
	"strings"
	"testing"
)

// TestImportBounds: an imported entry goes through config's one
// validator, so an entry outside its bounds is not imported (commented
// out, with the validator's reason) rather than written to the file.
func TestImportBounds(t *testing.T) {
	t.Parallel()
	celery := func(sched, extra string) string {
		return `{"source": "celery", "timezone": "UTC", "enable_utc": true, "entries": [{"name": "e", "task": "t", "schedule": ` + sched +
			`, "args": [], "kwargs": {}, "options": {}` + extra + `}]}`
	}
	django := func(every, period, extra string) string {
		return `[{"model": "django_celery_beat.intervalschedule", "pk": 1, "fields": {"every": ` + every + `, "period": "` + period + `"}},
 {"model": "django_celery_beat.periodictask", "pk": 1, "fields": {"name": "e", "task": "t", "interval": 1, "args": "[]", "kwargs": "{}", "enabled": true, "one_off": false` + extra + `}}]`
	}
	tests := []struct {
		name string
		src  string
		want string
	}{
		{name: "celery every 1ns", src: celery(`{"type": "interval", "seconds": 1e-9}`, ""), want: "below the minimum interval"},
		{name: "celery every 2400000h", src: celery(`{"type": "interval", "seconds": 8640000000000}`, ""), want: "too long"},
		{name: "celery last run in 2300", src: celery(`{"type": "interval", "seconds": 60}`, `, "last_run_at": "2300-01-01T00:00:00Z"`), want: "start_at 2300-01-01T00:00:00Z is outside"},
		{name: "django every 1 microsecond", src: django("1", "microseconds", ""), want: "below the minimum interval"},
		{name: "django start_time in 2300", src: django("5", "minutes", `, "start_time": "2300-01-01T00:00:00Z"`), want: "outside the times beatd schedules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src, err := Parse("src.json", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Convert(src, Options{Now: now})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Config.Entries) != 0 || len(res.Skipped) != 1 {
				t.Fatalf("imported %d entries, skipped %v; want e skipped", len(res.Config.Entries), res.Skipped)
			}
			if w := strings.Join(res.Warnings, "\n"); !strings.Contains(w, "not imported") || !strings.Contains(w, tt.want) {
				t.Errorf("warnings %q, want not imported: ...%q", w, tt.want)
			}
		})
	}
}
