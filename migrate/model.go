package migrate

import (
	"encoding/json"
	"time"
)

// Source is a schedule read from one of the supported sources.
type Source struct {
	Kind     string // "celery", "django" or "redbeat"
	Origin   string // file or URL it came from
	Timezone string // the app's timezone; "" when unknown
	// Notes are source-wide remarks for the YAML header.
	Notes    []string
	Warnings []string // source-wide, naming entries
	Entries  []*Entry
}

// Entry is one periodic task as the source describes it.
type Entry struct {
	Name     string
	Task     string
	Sched    Sched
	Zone     string          // the entry's own zone (django-celery-beat crontabs)
	Args     json.RawMessage // a JSON array, order kept
	Kwargs   json.RawMessage // a JSON object, order kept
	Options  []Option
	Enabled  bool
	OneOff   bool
	Start    time.Time // django-celery-beat start_time
	End      time.Time // django-celery-beat expires: no run after it
	Comment  string    // description
	Problems []string  // values the source could not carry faithfully

	// State: what celery beat last sent (zero when unknown).
	LastRunAt     time.Time
	TotalRunCount int64
}

// Option is one Celery send option, in source order.
type Option struct {
	Key   string
	Value json.RawMessage
}

// Sched is a Celery schedule in source-independent form.
type Sched struct {
	Type string // "crontab", "interval", "solar", "clocked" or "unknown"
	// crontab fields as written
	Minute, Hour, DayOfWeek, DayOfMonth, MonthOfYear string
	// interval
	Seconds  float64
	Relative bool
	// solar
	Event    string
	Lat, Lon float64
	// clocked
	At time.Time
	// unknown: what it was
	Repr string
}

// checkSched is the schedule in contrib/celery_dump.py's --next input form.
func (s Sched) checkJSON() map[string]any {
	switch s.Type {
	case "crontab":
		return map[string]any{"type": "crontab", "minute": s.Minute, "hour": s.Hour, "day_of_week": s.DayOfWeek,
			"day_of_month": s.DayOfMonth, "month_of_year": s.MonthOfYear}
	case "interval":
		return map[string]any{"type": "interval", "seconds": s.Seconds, "relative": s.Relative}
	case "solar":
		return map[string]any{"type": "solar", "event": s.Event, "lat": s.Lat, "lon": s.Lon}
	case "clocked":
		return map[string]any{"type": "clocked", "at": s.At.Format(time.RFC3339Nano)}
	}
	return map[string]any{"type": s.Type}
}
