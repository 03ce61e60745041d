package schedule

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// CrontabField names one of Celery's crontab() arguments.
type CrontabField int

// The crontab fields, in Celery's argument order.
const (
	Minute CrontabField = iota
	Hour
	DayOfWeek
	DayOfMonth
	MonthOfYear
)

var crontabFields = [...]struct {
	name     string
	size     int // Celery's max_: how many values the field has
	minValue int // Celery's min_
}{
	Minute:      {"minute", 60, 0},
	Hour:        {"hour", 24, 0},
	DayOfWeek:   {"day_of_week", 7, 0},
	DayOfMonth:  {"day_of_month", 31, 1},
	MonthOfYear: {"month_of_year", 12, 1},
}

func (f CrontabField) String() string { return crontabFields[f].name }

// Celery's crontab_parser patterns. Like Python's re.match they anchor at
// the start only, so "1-5-7" parses as "1-5", exactly as Celery does.
var (
	reRangeSteps = regexp.MustCompile(`^(\w+?)-(\w+)/(\w+)?`)
	reRange      = regexp.MustCompile(`^(\w+?)-(\w+)`)
	reStarSteps  = regexp.MustCompile(`^\*/(\w+)?`)
)

// reQuartzPart matches what Quartz means as L, W or # and Celery reads as an
// error or, worse, silently as something else (Celery reads "fril" and
// "mon#2" as Friday and Monday by their first three letters): beatd
// refuses these rather than fire on days the writer did not mean.
var reQuartzPart = regexp.MustCompile(`(?i)^(l|lw|l-\d+|\d+[wl]|(sun|mon|tue|wed|thu|fri|sat)l|[^#]*#.*)$`)

var monthNames = map[string]int{"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
	"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}

var weekdayNames = map[string]int{"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}

// ParseCrontabField expands one crontab field written as Celery accepts a
// string: "*", "*/n", "a", "a-b" (wrapping when b < a), "a-b/n", comma lists,
// and month or weekday names in any field. It returns the set as a bit mask.
func ParseCrontabField(f CrontabField, spec string) (uint64, error) {
	var acc uint64
	for _, part := range strings.Split(spec, ",") {
		if part == "" {
			return 0, fmt.Errorf("%s %q: empty part", f, spec)
		}
		if reQuartzPart.MatchString(part) {
			return 0, fmt.Errorf("%s %q: %q is Quartz's L, W or #, which Celery's crontab does not have; write the entry with cron: instead, such as cron: \"0 9 L * *\" (last day of the month) or \"0 9 * * FRI#2\"", f, spec, part)
		}
		set, err := parseCrontabPart(f, part)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", f, spec, err)
		}
		acc |= set
	}
	return acc, nil
}

func parseCrontabPart(f CrontabField, part string) (uint64, error) {
	fd := crontabFields[f]
	if m := reRangeSteps.FindStringSubmatch(part); m != nil {
		if m[3] == "" {
			return 0, fmt.Errorf("empty step")
		}
		vals, err := expandRange(f, m[1], m[2])
		if err != nil {
			return 0, err
		}
		return stepped(vals, m[3])
	}
	if m := reRange.FindStringSubmatch(part); m != nil {
		vals, err := expandRange(f, m[1], m[2])
		if err != nil {
			return 0, err
		}
		return maskOf(vals), nil
	}
	if m := reStarSteps.FindStringSubmatch(part); m != nil {
		if m[1] == "" {
			return 0, fmt.Errorf("empty step")
		}
		vals := make([]int, 0, fd.size)
		for v := fd.minValue; v < fd.minValue+fd.size; v++ {
			vals = append(vals, v)
		}
		return stepped(vals, m[1])
	}
	if part == "*" {
		return maskOf(rangeOf(fd.minValue, fd.minValue+fd.size-1)), nil
	}
	v, err := expandNumber(f, part)
	if err != nil {
		return 0, err
	}
	return 1 << uint(v), nil
}

func rangeOf(lo, hi int) []int {
	out := make([]int, 0, hi-lo+1)
	for v := lo; v <= hi; v++ {
		out = append(out, v)
	}
	return out
}

// expandRange follows Celery: when to < from the range wraps past the
// field's maximum back to its minimum.
func expandRange(f CrontabField, fromS, toS string) ([]int, error) {
	fd := crontabFields[f]
	from, err := expandNumber(f, fromS)
	if err != nil {
		return nil, err
	}
	to, err := expandNumber(f, toS)
	if err != nil {
		return nil, err
	}
	if to < from {
		return append(rangeOf(from, fd.minValue+fd.size-1), rangeOf(fd.minValue, to)...), nil
	}
	return rangeOf(from, to), nil
}

func stepped(vals []int, stepS string) (uint64, error) {
	step, err := pyInt(stepS)
	if err != nil {
		return 0, fmt.Errorf("invalid step %q", stepS)
	}
	if step <= 0 {
		return 0, fmt.Errorf("step must be positive, got %d", step)
	}
	var set uint64
	for i := 0; i < len(vals); i += step {
		set |= 1 << uint(vals[i])
	}
	return set, nil
}

func maskOf(vals []int) uint64 {
	var set uint64
	for _, v := range vals {
		set |= 1 << uint(v)
	}
	return set
}

// expandNumber reads an int, else a month name, else a weekday name (first
// three letters, any case), in that order and in any field, as Celery does.
func expandNumber(f CrontabField, s string) (int, error) {
	fd := crontabFields[f]
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("negative numbers not supported")
	}
	v, err := pyInt(s)
	if err != nil {
		key := strings.ToLower(s)
		if len(key) > 3 {
			key = key[:3]
		}
		var ok bool
		if v, ok = monthNames[key]; !ok {
			if v, ok = weekdayNames[key]; !ok {
				return 0, fmt.Errorf("invalid value %q", s)
			}
		}
	}
	if hi := fd.minValue + fd.size - 1; v > hi {
		return 0, fmt.Errorf("%d is out of range %d-%d", v, fd.minValue, hi)
	}
	if v < fd.minValue {
		return 0, fmt.Errorf("%d is out of range %d-%d", v, fd.minValue, fd.minValue+fd.size-1)
	}
	return v, nil
}

// pyInt parses like Python's int(str): surrounding white space, an optional
// sign and single underscores between digits are allowed.
func pyInt(s string) (int, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "_") || strings.HasSuffix(s, "_") || strings.Contains(s, "__") {
		return 0, strconv.ErrSyntax
	}
	s = strings.ReplaceAll(s, "_", "")
	v, err := strconv.Atoi(s)
	if err != nil || v > 1<<20 || v < -(1<<20) {
		return 0, strconv.ErrSyntax
	}
	return v, nil
}

// CheckCrontabValue validates one integer given for a field (Celery's int
// and iterable forms).
func CheckCrontabValue(f CrontabField, v int) (uint64, error) {
	fd := crontabFields[f]
	if v < fd.minValue || v >= fd.minValue+fd.size {
		return 0, fmt.Errorf("%s: %d is out of range %d-%d", f, v, fd.minValue, fd.minValue+fd.size-1)
	}
	return 1 << uint(v), nil
}

// Crontab is Celery's celery.schedules.crontab: fires on every minute whose
// wall-clock fields, in its zone, match all five sets. Unlike Vixie cron,
// day_of_week and day_of_month must both match.
type Crontab struct {
	cal    calendar
	fields [5]uint64
	spread bool // a field had an H (see Spread)
}

// NewCrontab builds a crontab from expanded field masks (as returned by
// ParseCrontabField). An error says when the spec can never fire.
func NewCrontab(fields [5]uint64, loc *time.Location) (*Crontab, error) {
	if loc == nil {
		loc = time.UTC
	}
	c := &Crontab{fields: fields, cal: calendar{
		second: 1,
		minute: fields[Minute],
		hour:   uint32(fields[Hour]),
		dow:    uint8(fields[DayOfWeek]),
		dom:    uint32(fields[DayOfMonth]),
		month:  uint16(fields[MonthOfYear]),
		loc:    loc,
	}}
	if !c.cal.canFire() {
		return nil, fmt.Errorf("crontab %s can never fire: no date matches day_of_month, month_of_year and day_of_week together", c)
	}
	return c, nil
}

// ParseCrontab parses Celery's crontab.from_string form "m h dom mon dow".
func ParseCrontab(s string, loc *time.Location) (*Crontab, error) {
	parts := strings.Split(s, " ")
	if len(parts) != 5 {
		return nil, fmt.Errorf("crontab %q: want 5 fields separated by single spaces, got %d", s, len(parts))
	}
	order := [5]CrontabField{Minute, Hour, DayOfMonth, MonthOfYear, DayOfWeek}
	var fields [5]uint64
	for i, p := range parts {
		m, err := ParseCrontabField(order[i], p)
		if err != nil {
			return nil, err
		}
		fields[order[i]] = m
	}
	return NewCrontab(fields, loc)
}

// ParseCrontabFor is ParseCrontab for the entry called name: an H in a
// field is resolved with the hash of name first (see SpreadHash).
func ParseCrontabFor(s, name string, loc *time.Location) (*Crontab, error) {
	parts := strings.Split(s, " ")
	hashed := false
	if len(parts) == 5 {
		order := [5]CrontabField{Minute, Hour, DayOfMonth, MonthOfYear, DayOfWeek}
		for i, p := range parts {
			r, h, err := ResolveCrontabField(order[i], p, name)
			if err != nil {
				return nil, err
			}
			parts[i], hashed = r, hashed || h
		}
	}
	c, err := ParseCrontab(strings.Join(parts, " "), loc)
	if err != nil {
		return nil, err
	}
	c.spread = hashed
	return c, nil
}

// WithSpread marks a crontab built from fields (NewCrontab) as having had
// an H, for Spread; it returns c.
func (c *Crontab) WithSpread() *Crontab {
	c.spread = true
	return c
}

// Next returns the first slot strictly after t.
func (c *Crontab) Next(t time.Time) time.Time { return c.cal.Next(t) }

// Location is the zone whose wall clock the fields are matched against.
func (c *Crontab) Location() *time.Location { return c.cal.loc }

// String renders the expanded sets field by field, e.g.
// "crontab(minute=30, hour=2, day_of_week=1-5, day_of_month=*, month_of_year=*)".
func (c *Crontab) String() string {
	var b strings.Builder
	b.WriteString("crontab(")
	for f := Minute; f <= MonthOfYear; f++ {
		if f > Minute {
			b.WriteString(", ")
		}
		b.WriteString(f.String())
		b.WriteString("=")
		b.WriteString(describeSet(c.fields[f], crontabFields[f].minValue, crontabFields[f].size))
	}
	b.WriteString(")")
	return b.String()
}

// describeSet writes a set compactly: "*" when full, else ranges like "1-5,7".
func describeSet(set uint64, lo, size int) string {
	if set == maskOf(rangeOf(lo, lo+size-1)) {
		return "*"
	}
	var parts []string
	for v := lo; v < lo+size; v++ {
		if set&(1<<uint(v)) == 0 {
			continue
		}
		end := v
		for end+1 < lo+size && set&(1<<uint(end+1)) != 0 {
			end++
		}
		if end > v {
			parts = append(parts, fmt.Sprintf("%d-%d", v, end))
		} else {
			parts = append(parts, strconv.Itoa(v))
		}
		v = end
	}
	return strings.Join(parts, ",")
}
