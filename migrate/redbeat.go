package migrate

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redbeatDefinition is the "definition" field of a redbeat:NAME hash.
type redbeatDefinition struct {
	Name     string          `json:"name"`
	Task     string          `json:"task"`
	Args     json.RawMessage `json:"args"`
	Kwargs   json.RawMessage `json:"kwargs"`
	Options  json.RawMessage `json:"options"`
	Schedule json.RawMessage `json:"schedule"`
	Enabled  *bool           `json:"enabled"`
}

// readRedBeat reads every RedBeat entry under prefix ("redbeat:") from
// Redis: the hashes with a definition field.
func readRedBeat(ctx context.Context, url, prefix string) (*Source, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redbeat: %w", err)
	}
	cli := redis.NewClient(opt)
	defer cli.Close()
	src := &Source{Kind: "redbeat", Origin: redactURL(url), Timezone: "UTC"}
	src.Notes = append(src.Notes, "RedBeat entries (hashes "+prefix+"NAME in Redis); the app's timezone is not stored there: set timezone below to the app's")
	var keys []string
	iter := cli.Scan(ctx, 0, escapeGlob(prefix)+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("redbeat: scan %s*: %w", prefix, err)
	}
	sort.Strings(keys)
	for _, k := range keys {
		typ, err := cli.Type(ctx, k).Result()
		if err != nil {
			return nil, fmt.Errorf("redbeat: %s: %w", k, err)
		}
		if typ != "hash" {
			continue // the schedule zset, the statics set, the lock
		}
		h, err := cli.HGetAll(ctx, k).Result()
		if err != nil {
			return nil, fmt.Errorf("redbeat: %s: %w", k, err)
		}
		def, ok := h["definition"]
		if !ok {
			continue
		}
		e, err := parseRedBeatEntry(strings.TrimPrefix(k, prefix), []byte(def), []byte(h["meta"]))
		if err != nil {
			return nil, fmt.Errorf("redbeat: %s: %w", k, err)
		}
		src.Entries = append(src.Entries, e)
	}
	return src, nil
}

func parseRedBeatEntry(key string, def, meta []byte) (*Entry, error) {
	var d redbeatDefinition
	if err := json.Unmarshal(def, &d); err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	name := d.Name
	if name == "" {
		name = key
	}
	e := &Entry{Name: name, Task: d.Task, Args: d.Args, Kwargs: d.Kwargs, Enabled: d.Enabled == nil || *d.Enabled}
	if len(e.Args) == 0 || string(e.Args) == "null" {
		e.Args = json.RawMessage("[]")
	}
	if len(e.Kwargs) == 0 || string(e.Kwargs) == "null" {
		e.Kwargs = json.RawMessage("{}")
	}
	opts, err := orderedObject(d.Options)
	if err != nil {
		return nil, fmt.Errorf("options: %w", err)
	}
	e.Options = opts
	var s map[string]json.RawMessage
	if err := json.Unmarshal(d.Schedule, &s); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	switch str(s["__type__"]) {
	case "crontab":
		e.Sched = Sched{Type: "crontab", Minute: field(s["minute"]), Hour: field(s["hour"]), DayOfWeek: field(s["day_of_week"]),
			DayOfMonth: field(s["day_of_month"]), MonthOfYear: field(s["month_of_year"])}
	case "interval":
		var iv struct {
			Every    float64 `json:"every"`
			Relative bool    `json:"relative"`
		}
		if err := json.Unmarshal(d.Schedule, &iv); err != nil {
			return nil, fmt.Errorf("interval schedule: %w", err)
		}
		e.Sched = Sched{Type: "interval", Seconds: iv.Every, Relative: iv.Relative}
	default:
		e.Sched = Sched{Type: "unknown", Repr: string(d.Schedule)}
	}
	if len(meta) > 0 {
		var m struct {
			LastRunAt     json.RawMessage `json:"last_run_at"`
			TotalRunCount int64           `json:"total_run_count"`
		}
		if err := json.Unmarshal(meta, &m); err != nil {
			return nil, fmt.Errorf("meta: %w", err)
		}
		e.TotalRunCount = m.TotalRunCount
		if len(m.LastRunAt) > 0 && string(m.LastRunAt) != "null" {
			t, err := redbeatTime(m.LastRunAt)
			if err != nil {
				return nil, fmt.Errorf("meta last_run_at: %w", err)
			}
			e.LastRunAt = t
		}
	}
	return e, nil
}

// field is a crontab field RedBeat stored as a string or a number.
func field(raw json.RawMessage) string {
	if s := str(raw); s != "" {
		return s
	}
	var list []any
	if json.Unmarshal(raw, &list) == nil {
		parts := make([]string, len(list))
		for i, v := range list {
			parts[i] = fmt.Sprint(v)
		}
		return strings.Join(parts, ",")
	}
	return strings.TrimSpace(string(raw))
}

// redbeatTime decodes RedBeat's {"__type__": "datetime", "year": ...,
// "timezone": NAME or offset seconds} (no timezone: UTC).
func redbeatTime(raw json.RawMessage) (time.Time, error) {
	var p struct {
		Type        string          `json:"__type__"`
		Year        int             `json:"year"`
		Month       int             `json:"month"`
		Day         int             `json:"day"`
		Hour        int             `json:"hour"`
		Minute      int             `json:"minute"`
		Second      int             `json:"second"`
		Microsecond int             `json:"microsecond"`
		Zone        json.RawMessage `json:"timezone"`
	}
	if err := json.Unmarshal(raw, &p); err != nil || p.Type != "datetime" {
		return time.Time{}, fmt.Errorf("%s is not a RedBeat datetime", raw)
	}
	loc := time.UTC
	if d := p; len(d.Zone) > 0 && string(d.Zone) != "null" {
		if name := str(d.Zone); name != "" {
			l, err := time.LoadLocation(name)
			if err != nil {
				return time.Time{}, fmt.Errorf("timezone %q: %w", name, err)
			}
			loc = l
		} else {
			var secs float64
			if err := json.Unmarshal(d.Zone, &secs); err != nil {
				return time.Time{}, fmt.Errorf("timezone %s", d.Zone)
			}
			loc = time.FixedZone("", int(secs))
		}
	}
	return time.Date(p.Year, time.Month(p.Month), p.Day, p.Hour, p.Minute, p.Second, p.Microsecond*1000, loc), nil
}

func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)
	return r.Replace(s)
}

// redactURL hides a password in a Redis URL.
func redactURL(u string) string {
	if at := strings.LastIndex(u, "@"); at > 0 {
		if scheme := strings.Index(u, "://"); scheme >= 0 && scheme < at {
			return u[:scheme+3] + "***" + u[at:]
		}
	}
	return u
}
