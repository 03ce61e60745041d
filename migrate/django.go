package migrate

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// djangoRow is one object of `manage.py dumpdata` output.
type djangoRow struct {
	Model  string                     `json:"model"`
	PK     json.RawMessage            `json:"pk"`
	Fields map[string]json.RawMessage `json:"fields"`
}

// djangoPeriods are IntervalSchedule.period's choices, in seconds.
var djangoPeriods = map[string]float64{"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1, "microseconds": 1e-6}

func parseDjango(origin string, rows []djangoRow) (*Source, error) {
	src := &Source{Kind: "django", Origin: origin, Timezone: "UTC"}
	src.Notes = append(src.Notes,
		"django-celery-beat database (manage.py dumpdata django_celery_beat)",
		// celery/message.go sends it in the Redis message's properties,
		// where Celery puts dcb's; the AMQP message has no field for it
		// (py-amqp drops unknown properties, dcb's included).
		"like django-celery-beat, beatd sends periodic_task_name (the entry's name) with each task on Redis, so django-celery-results links results to it; on RabbitMQ neither does (py-amqp drops the property)",
		"django-celery-beat fires an edited entry at once; beatd waits for its next slot")
	byModel := map[string]map[string]map[string]json.RawMessage{}
	var tasks []djangoRow
	for _, r := range rows {
		model := strings.TrimPrefix(r.Model, "django_celery_beat.")
		if model == "periodictask" {
			tasks = append(tasks, r)
			continue
		}
		if byModel[model] == nil {
			byModel[model] = map[string]map[string]json.RawMessage{}
		}
		byModel[model][string(r.PK)] = r.Fields
	}
	sort.SliceStable(tasks, func(i, j int) bool { return str(tasks[i].Fields["name"]) < str(tasks[j].Fields["name"]) })
	for _, r := range tasks {
		f := r.Fields
		name := str(f["name"])
		e := &Entry{Name: name, Task: str(f["task"]), Enabled: boolean(f["enabled"], true), OneOff: boolean(f["one_off"], false),
			Comment: str(f["description"])}
		where := fmt.Sprintf("%s: periodic task %q", origin, name)
		found := 0
		for _, kind := range []string{"crontab", "interval", "solar", "clocked"} {
			ref := f[kind]
			if len(ref) == 0 || string(ref) == "null" {
				continue
			}
			found++
			m := byModel[kind+"schedule"][string(ref)]
			if m == nil {
				return nil, fmt.Errorf("%s: %s schedule %s is not in the dump (dump the whole django_celery_beat app)", where, kind, ref)
			}
			switch kind {
			case "crontab":
				e.Sched = Sched{Type: "crontab", Minute: str(m["minute"]), Hour: str(m["hour"]), DayOfWeek: str(m["day_of_week"]),
					DayOfMonth: str(m["day_of_month"]), MonthOfYear: str(m["month_of_year"])}
				e.Zone = str(m["timezone"])
			case "interval":
				every, err := strconv.ParseFloat(string(m["every"]), 64)
				unit, ok := djangoPeriods[str(m["period"])]
				if err != nil || !ok {
					return nil, fmt.Errorf("%s: interval every=%s period=%s", where, m["every"], m["period"])
				}
				e.Sched = Sched{Type: "interval", Seconds: every * unit}
			case "solar":
				lat, err1 := strconv.ParseFloat(strings.Trim(string(m["latitude"]), `"`), 64)
				lon, err2 := strconv.ParseFloat(strings.Trim(string(m["longitude"]), `"`), 64)
				if err1 != nil || err2 != nil {
					return nil, fmt.Errorf("%s: solar latitude %s longitude %s", where, m["latitude"], m["longitude"])
				}
				e.Sched = Sched{Type: "solar", Event: str(m["event"]), Lat: lat, Lon: lon}
			case "clocked":
				t, err := djangoTime(m["clocked_time"])
				if err != nil {
					return nil, fmt.Errorf("%s: clocked_time: %w", where, err)
				}
				e.Sched = Sched{Type: "clocked", At: t}
			}
		}
		if found != 1 {
			e.Sched = Sched{Type: "unknown", Repr: fmt.Sprintf("%d schedules linked (django-celery-beat requires exactly one)", found)}
		}
		var err error
		if e.Args, err = jsonText(f["args"], "[]"); err != nil {
			return nil, fmt.Errorf("%s: args: %w", where, err)
		}
		if e.Kwargs, err = jsonText(f["kwargs"], "{}"); err != nil {
			return nil, fmt.Errorf("%s: kwargs: %w", where, err)
		}
		for _, k := range []string{"queue", "exchange", "routing_key"} {
			if v := str(f[k]); v != "" {
				e.Options = append(e.Options, Option{Key: k, Value: f[k]})
			}
		}
		if p := f["priority"]; len(p) > 0 && string(p) != "null" {
			e.Options = append(e.Options, Option{Key: "priority", Value: p})
		}
		if exp := f["expires"]; len(exp) > 0 && string(exp) != "null" {
			t, err := djangoTime(exp)
			if err != nil {
				return nil, fmt.Errorf("%s: expires: %w", where, err)
			}
			e.Options = append(e.Options, Option{Key: "expires", Value: json.RawMessage(strconv.Quote(t.Format(time.RFC3339Nano)))})
			e.End = t // django-celery-beat also stops running the task then
		} else if s := f["expire_seconds"]; len(s) > 0 && string(s) != "null" {
			e.Options = append(e.Options, Option{Key: "expires", Value: s})
		}
		if h, err := jsonText(f["headers"], "{}"); err != nil {
			return nil, fmt.Errorf("%s: headers: %w", where, err)
		} else if string(h) != "{}" {
			e.Options = append(e.Options, Option{Key: "headers", Value: h})
		}
		if st := f["start_time"]; len(st) > 0 && string(st) != "null" {
			if e.Start, err = djangoTime(st); err != nil {
				return nil, fmt.Errorf("%s: start_time: %w", where, err)
			}
		}
		if lr := f["last_run_at"]; len(lr) > 0 && string(lr) != "null" {
			if e.LastRunAt, err = djangoTime(lr); err != nil {
				return nil, fmt.Errorf("%s: last_run_at: %w", where, err)
			}
		}
		if n := f["total_run_count"]; len(n) > 0 {
			e.TotalRunCount, _ = strconv.ParseInt(string(n), 10, 64)
		}
		src.Entries = append(src.Entries, e)
	}
	return src, nil
}

// str is a JSON string's value ("" for null or anything else).
func str(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

func boolean(raw json.RawMessage, def bool) bool {
	var b bool
	if json.Unmarshal(raw, &b) != nil {
		return def
	}
	return b
}

// jsonText reads a TextField holding JSON (args, kwargs, headers).
func jsonText(raw json.RawMessage, def string) (json.RawMessage, error) {
	s := strings.TrimSpace(str(raw))
	if s == "" {
		return json.RawMessage(def), nil
	}
	if !json.Valid([]byte(s)) {
		return nil, fmt.Errorf("%q is not JSON", s)
	}
	return json.RawMessage(s), nil
}

// djangoTime reads a DateTimeField as dumpdata writes it: ISO 8601 with a
// "Z" or an offset (USE_TZ), or naive (read as UTC).
func djangoTime(raw json.RawMessage) (time.Time, error) {
	s := str(raw)
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a date and time", s)
}
