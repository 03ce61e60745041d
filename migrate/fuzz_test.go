package migrate

import (
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/fuzzcheck"
)

// FuzzImport is beatd import's input path: a celery_dump.py dump or a
// django-celery-beat dumpdata is parsed and converted, each entry through
// config's validator, within fuzzcheck's bounds, and every entry of the
// converted file fires at strictly increasing slots. Its corpus
// (testdata/fuzz/FuzzImport) holds intervals of 1ns and 2400000h and a
// start_time in 2300, in both forms.
func FuzzImport(f *testing.F) {
	f.Add([]byte(`{"source": "celery", "timezone": "UTC", "enable_utc": true, "entries": [
 {"name": "p", "task": "t", "schedule": {"type": "interval", "seconds": 60, "relative": false}, "args": [1], "kwargs": {"a": 2}, "options": {"queue": "q", "expires": 30}}]}`))
	f.Add([]byte(`[{"model": "django_celery_beat.crontabschedule", "pk": 1, "fields": {"minute": "30", "hour": "7", "day_of_week": "mon-fri", "day_of_month": "*", "month_of_year": "*", "timezone": "America/New_York"}},
 {"model": "django_celery_beat.periodictask", "pk": 1, "fields": {"name": "morning", "task": "t", "crontab": 1, "args": "[]", "kwargs": "{}", "enabled": true, "one_off": false}}]`))
	now := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		var res *Result
		fuzzcheck.Bounded(t, len(data), func() {
			src, err := Parse("fuzz.json", data)
			if err == nil {
				res, _ = Convert(src, Options{Now: now})
			}
		})
		if res == nil {
			return
		}
		for _, e := range res.Config.Entries {
			fuzzcheck.Slots(t, e.Name, e.Schedule, config.DefaultMinInterval)
		}
	})
}
