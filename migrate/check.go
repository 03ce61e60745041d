package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"time"

	"github.com/beatd/beatd/schedule"
)

// Difference is one fire time on which beatd and Celery disagree.
type Difference struct {
	Entry      string
	Beatd      time.Time // zero: beatd does not fire there
	Celery     time.Time // zero: Celery does not fire there
	Documented string    // a deviation the README documents, or ""
}

func (d Difference) String() string {
	f := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	s := fmt.Sprintf("entry %q: beatd %s, Celery %s", d.Entry, f(d.Beatd), f(d.Celery))
	if d.Documented != "" {
		s += " (documented deviation: " + d.Documented + ")"
	}
	return s
}

// Helper runs contrib/celery_dump.py.
type Helper struct {
	Python string // e.g. /usr/bin/python3
	Script string // path of celery_dump.py
}

type helperAnswer struct {
	Times      []string `json:"times"`
	Error      string   `json:"error"`
	Deviations []struct {
		At  *string `json:"at"`
		Why string  `json:"why"`
	} `json:"deviations"`
}

// Compare computes the next n fire times of every checked entry with beatd
// and with Celery (through the helper) and returns every difference:
// crontab and clocked times must be equal, intervals within a millisecond,
// solar events within a minute.
func Compare(ctx context.Context, h Helper, checks []Check, n int, now time.Time) ([]Difference, error) {
	type in struct {
		Name     string         `json:"name"`
		Zone     string         `json:"zone"`
		From     string         `json:"from"`
		Schedule map[string]any `json:"schedule"`
	}
	var req struct {
		Entries []in `json:"entries"`
	}
	for _, c := range checks {
		req.Entries = append(req.Entries, in{Name: c.Name, Zone: c.Zone, From: c.From.Format(time.RFC3339Nano), Schedule: c.Sched.checkJSON()})
	}
	body, _ := json.Marshal(req)
	cmd := exec.CommandContext(ctx, h.Python, h.Script, "--next", fmt.Sprint(n), "--from", now.UTC().Format(time.RFC3339Nano))
	cmd.Stdin = bytes.NewReader(body)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("check: %s %s: %w: %s", h.Python, h.Script, err, stderr.Bytes())
	}
	var answers map[string]helperAnswer
	if err := json.Unmarshal(stdout.Bytes(), &answers); err != nil {
		return nil, fmt.Errorf("check: helper output: %w", err)
	}
	var diffs []Difference
	for _, c := range checks {
		a, ok := answers[c.Name]
		if !ok || a.Error != "" {
			return nil, fmt.Errorf("check: entry %q: Celery could not compute it: %s", c.Name, a.Error)
		}
		var celery []time.Time
		for _, s := range a.Times {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return nil, fmt.Errorf("check: entry %q: %w", c.Name, err)
			}
			celery = append(celery, t)
		}
		documented := map[int64]string{}
		for _, d := range a.Deviations {
			if d.At != nil {
				if t, err := time.Parse(time.RFC3339Nano, *d.At); err == nil {
					documented[t.Unix()] = d.Why
				}
			}
		}
		beatd := beatdTimes(c, n)
		diffs = append(diffs, compareTimes(c, beatd, celery, documented)...)
	}
	return diffs, nil
}

// beatdTimes chains Next from the check's start, the interval grid
// anchored there unless the entry has its own anchor (as the scheduler
// anchors a new entry where it first schedules it).
func beatdTimes(c Check, n int) []time.Time {
	s := schedule.Anchor(c.Entry.Schedule, c.From)
	var out []time.Time
	t := c.From
	for len(out) < n {
		t = s.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t)
	}
	return out
}

func tolerance(s Sched) time.Duration {
	switch s.Type {
	case "solar":
		return time.Minute
	case "interval":
		return time.Millisecond
	}
	return 0
}

// compareTimes matches the two lists within the tolerance, over the span
// both cover, and reports what is in one and not the other.
func compareTimes(c Check, beatd, celery []time.Time, documented map[int64]string) []Difference {
	tol := tolerance(c.Sched)
	var end time.Time
	if len(beatd) > 0 && len(celery) > 0 {
		end = beatd[len(beatd)-1]
		if celery[len(celery)-1].Before(end) {
			end = celery[len(celery)-1]
		}
	}
	var out []Difference
	i, j := 0, 0
	for i < len(beatd) || j < len(celery) {
		switch {
		case i < len(beatd) && j < len(celery) && absDur(beatd[i].Sub(celery[j])) <= tol:
			i++
			j++
		case j >= len(celery) || (i < len(beatd) && beatd[i].Before(celery[j])):
			if !end.IsZero() && beatd[i].After(end) {
				i++
				continue
			}
			out = append(out, Difference{Entry: c.Name, Beatd: beatd[i], Documented: explain(c, beatd[i], documented, true)})
			i++
		default:
			if !end.IsZero() && celery[j].After(end) {
				j++
				continue
			}
			out = append(out, Difference{Entry: c.Name, Celery: celery[j], Documented: explain(c, celery[j], documented, false)})
			j++
		}
	}
	if len(beatd) == 0 && len(celery) == 0 {
		return nil
	}
	return out
}

// explain names the documented deviation behind a difference, if any:
// what the helper flagged (a wall time in a DST gap, which Celery reads an
// hour late), or Celery 5.2.6's month skip (west of UTC, a restricted
// day_of_month or month_of_year spec skips days beatd fires on).
func explain(c Check, t time.Time, documented map[int64]string, beatdOnly bool) string {
	if why, ok := documented[t.Unix()]; ok {
		return why
	}
	if c.Documented != "" {
		return c.Documented
	}
	if c.Sched.Type != "crontab" {
		return ""
	}
	for at, why := range documented {
		if d := t.Unix() - at; d > -4*3600 && d < 4*3600 {
			return why // beatd's side of a DST-gap difference
		}
	}
	if beatdOnly && (c.Sched.DayOfMonth != "*" || c.Sched.MonthOfYear != "*") {
		if loc, err := time.LoadLocation(c.Zone); err == nil {
			if _, off := t.In(loc).Zone(); off < 0 {
				return "celery_5_2_6_month_skip"
			}
		}
	}
	return ""
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
