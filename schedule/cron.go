package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

const cronStar = 1 << 63 // robfig/cron marks "*" and "?" fields with this bit.

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour |
	cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Cron is a standard cron spec with Vixie semantics: when both day of month
// and day of week are restricted, a day matching either fires. Five fields,
// or six with leading seconds, or a descriptor such as @daily.
type Cron struct {
	cal  calendar
	expr string
}

// ParseCron parses expr with robfig/cron's standard parser and evaluates it
// on loc's wall clock with beatd's DST policy.
func ParseCron(expr string, loc *time.Location) (*Cron, error) {
	if loc == nil {
		loc = time.UTC
	}
	trimmed := strings.TrimSpace(expr)
	if strings.HasPrefix(trimmed, "TZ=") || strings.HasPrefix(trimmed, "CRON_TZ=") {
		return nil, fmt.Errorf("cron %q: set the zone with the entry's timezone key, not a TZ= prefix", expr)
	}
	if strings.HasPrefix(trimmed, "@every") {
		return nil, fmt.Errorf("cron %q: use the entry's every key for intervals", expr)
	}
	sched, err := cronParser.Parse(trimmed)
	if err != nil {
		return nil, fmt.Errorf("cron %q: %w", expr, err)
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron %q: unsupported schedule", expr)
	}
	c := &Cron{expr: trimmed, cal: calendar{
		second:  spec.Second &^ cronStar,
		minute:  spec.Minute &^ cronStar,
		hour:    uint32(spec.Hour &^ cronStar),
		dom:     uint32(spec.Dom &^ cronStar),
		month:   uint16(spec.Month &^ cronStar),
		dow:     uint8(spec.Dow &^ cronStar),
		orDays:  spec.Dom&cronStar == 0 && spec.Dow&cronStar == 0,
		seconds: true,
		loc:     loc,
	}}
	if !c.cal.canFire() {
		return nil, fmt.Errorf("cron %q can never fire: no date matches its day and month fields", expr)
	}
	return c, nil
}

// Next returns the first slot strictly after t.
func (c *Cron) Next(t time.Time) time.Time { return c.cal.Next(t) }

// Location is the zone whose wall clock the fields are matched against.
func (c *Cron) Location() *time.Location { return c.cal.loc }

func (c *Cron) String() string { return "cron(" + c.expr + ")" }
