package config

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Calendar is a named set of days an entry can exclude: dates, inclusive
// date ranges and weekdays, matched against a slot's local date in the
// entry's zone ("every weekday at 9:00, except holidays").
type Calendar struct {
	Name     string
	ranges   [][2]civil // sorted by start; a date is a one-day range
	weekdays [7]bool
}

// civil is a date without a zone, comparable as a number (yyyymmdd).
type civil int32

func civilOf(t time.Time) civil {
	y, m, d := t.Date()
	return civil(y*10000 + int(m)*100 + d)
}

// Excludes says whether t, read in loc, falls on one of c's days.
func (c *Calendar) Excludes(t time.Time, loc *time.Location) bool {
	lt := t.In(loc)
	if c.weekdays[lt.Weekday()] {
		return true
	}
	day := civilOf(lt)
	i := sort.Search(len(c.ranges), func(i int) bool { return c.ranges[i][0] > day })
	// Ranges may overlap: look back over every one starting at or before day.
	for j := i - 1; j >= 0; j-- {
		if c.ranges[j][1] >= day {
			return true
		}
	}
	return false
}

var weekdayNames = map[string]time.Weekday{
	"sun": time.Sunday, "sunday": time.Sunday, "mon": time.Monday, "monday": time.Monday,
	"tue": time.Tuesday, "tuesday": time.Tuesday, "wed": time.Wednesday, "wednesday": time.Wednesday,
	"thu": time.Thursday, "thursday": time.Thursday, "fri": time.Friday, "friday": time.Friday,
	"sat": time.Saturday, "saturday": time.Saturday,
}

// calendars decodes the top-level calendars: a mapping from name to a
// list of "YYYY-MM-DD", "YYYY-MM-DD..YYYY-MM-DD" (inclusive) and weekday
// names.
func (d *decoder) calendars(n *yaml.Node) map[string]*Calendar {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "calendars must be a mapping from calendar name to a list of dates, date ranges (2026-12-24..2027-01-01) and weekdays")
		return nil
	}
	out := map[string]*Calendar{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], deref(n.Content[i+1])
		if k.Value == "" {
			d.errorf(k, "a calendar needs a name")
			continue
		}
		if _, dup := out[k.Value]; dup {
			d.errorf(k, "duplicate calendar %q", k.Value)
			continue
		}
		if v.Kind != yaml.SequenceNode {
			d.errorf(v, "calendar %q must be a list of dates, date ranges and weekdays", k.Value)
			continue
		}
		c := &Calendar{Name: k.Value}
		for _, item := range v.Content {
			d.calendarItem(c, deref(item))
		}
		sort.Slice(c.ranges, func(i, j int) bool { return c.ranges[i][0] < c.ranges[j][0] })
		out[k.Value] = c
	}
	return out
}

func (d *decoder) calendarItem(c *Calendar, n *yaml.Node) {
	s := strings.TrimSpace(n.Value)
	if n.Kind != yaml.ScalarNode || s == "" {
		d.errorf(n, "calendar %q: want a date (2026-12-25), a range (2026-12-24..2026-12-31) or a weekday (sat)", c.Name)
		return
	}
	if wd, ok := weekdayNames[strings.ToLower(s)]; ok {
		c.weekdays[wd] = true
		return
	}
	from, to, isRange := strings.Cut(s, "..")
	a, err := time.Parse(time.DateOnly, strings.TrimSpace(from))
	if err != nil {
		d.errorf(n, "calendar %q: %q is not a date (2026-12-25), a range (2026-12-24..2026-12-31) or a weekday (sat)", c.Name, s)
		return
	}
	b := a
	if isRange {
		if b, err = time.Parse(time.DateOnly, strings.TrimSpace(to)); err != nil {
			d.errorf(n, "calendar %q: %q: the range's end is not a date", c.Name, s)
			return
		}
		if b.Before(a) {
			d.errorf(n, "calendar %q: %q ends before it starts", c.Name, s)
			return
		}
	}
	c.ranges = append(c.ranges, [2]civil{civilOf(a), civilOf(b)})
}

// exclude decodes an entry's exclude: a list of calendar names.
func (d *decoder) exclude(n *yaml.Node, name string, def *defaults) []*Calendar {
	n = deref(n)
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "entry %q: exclude must be a list of calendar names", name)
		return nil
	}
	var out []*Calendar
	for _, item := range n.Content {
		item = deref(item)
		c := def.calendars[item.Value]
		if c == nil {
			known := make([]string, 0, len(def.calendars))
			for k := range def.calendars {
				known = append(known, k)
			}
			sort.Strings(known)
			msg := "none is defined (top-level calendars)"
			if len(known) > 0 {
				msg = "known: " + strings.Join(known, ", ")
			}
			d.errorf(item, "entry %q: unknown calendar %q; %s", name, item.Value, msg)
			continue
		}
		out = append(out, c)
	}
	return out
}

// Excluded says whether the slot t of e falls on a day one of its
// exclude calendars holds, in the entry's zone.
func (e *Entry) Excluded(t time.Time) bool {
	loc := e.Location
	if loc == nil {
		loc = time.UTC
	}
	for _, c := range e.Exclude() {
		if c.Excludes(t, loc) {
			return true
		}
	}
	return false
}

func (c *Calendar) String() string { return fmt.Sprintf("calendar %s", c.Name) }
