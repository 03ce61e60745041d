package migrate

import (
	"encoding/json"
	"fmt"
	"time"
)

// celeryDump is what contrib/celery_dump.py writes.
type celeryDump struct {
	Source    string   `json:"source"`
	App       string   `json:"app"`
	Timezone  *string  `json:"timezone"`
	EnableUTC bool     `json:"enable_utc"`
	Notes     []string `json:"notes"`
	StateOnly []string `json:"state_only"`
	Entries   []struct {
		Name     string `json:"name"`
		Task     string `json:"task"`
		Schedule struct {
			Type        string  `json:"type"`
			Minute      string  `json:"minute"`
			Hour        string  `json:"hour"`
			DayOfWeek   string  `json:"day_of_week"`
			DayOfMonth  string  `json:"day_of_month"`
			MonthOfYear string  `json:"month_of_year"`
			Seconds     float64 `json:"seconds"`
			Relative    bool    `json:"relative"`
			Event       string  `json:"event"`
			Lat         float64 `json:"lat"`
			Lon         float64 `json:"lon"`
			Repr        string  `json:"repr"`
			Class       string  `json:"class"`
		} `json:"schedule"`
		Args          json.RawMessage `json:"args"`
		Kwargs        json.RawMessage `json:"kwargs"`
		Options       json.RawMessage `json:"options"`
		LastRunAt     *string         `json:"last_run_at"`
		TotalRunCount int64           `json:"total_run_count"`
		Problems      []string        `json:"problems"`
	} `json:"entries"`
}

func parseCeleryDump(origin string, data []byte) (*Source, error) {
	var d celeryDump
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: not a celery_dump.py dump: %w", origin, err)
	}
	src := &Source{Kind: "celery", Origin: origin, Timezone: "UTC"}
	if d.Timezone != nil && *d.Timezone != "" {
		src.Timezone = *d.Timezone
	} else if !d.EnableUTC {
		src.Notes = append(src.Notes, "the app sets enable_utc = False and no timezone, so celery beat used the server's local time; beatd uses UTC: set timezone below to the server's zone")
	}
	if d.App != "" {
		src.Notes = append(src.Notes, "Celery app "+d.App)
	}
	src.Notes = append(src.Notes, d.Notes...)
	for _, n := range d.StateOnly {
		src.Warnings = append(src.Warnings, fmt.Sprintf("entry %q is in celery beat's schedule file but not in the app's schedule: not imported", n))
	}
	for _, e := range d.Entries {
		s := e.Schedule
		en := &Entry{Name: e.Name, Task: e.Task, Args: e.Args, Kwargs: e.Kwargs, Enabled: true,
			TotalRunCount: e.TotalRunCount, Problems: e.Problems,
			Sched: Sched{Type: s.Type, Minute: s.Minute, Hour: s.Hour, DayOfWeek: s.DayOfWeek,
				DayOfMonth: s.DayOfMonth, MonthOfYear: s.MonthOfYear, Seconds: s.Seconds,
				Relative: s.Relative, Event: s.Event, Lat: s.Lat, Lon: s.Lon, Repr: s.Repr}}
		if s.Class != "" {
			en.Sched.Repr = s.Class + ": " + s.Repr
		}
		opts, err := orderedObject(e.Options)
		if err != nil {
			return nil, fmt.Errorf("%s: entry %q options: %w", origin, e.Name, err)
		}
		en.Options = opts
		if e.LastRunAt != nil {
			t, err := time.Parse(time.RFC3339Nano, *e.LastRunAt)
			if err != nil {
				return nil, fmt.Errorf("%s: entry %q last_run_at %q: %w", origin, e.Name, *e.LastRunAt, err)
			}
			en.LastRunAt = t
		}
		src.Entries = append(src.Entries, en)
	}
	return src, nil
}
