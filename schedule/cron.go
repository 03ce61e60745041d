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
// or six with leading seconds, or a descriptor such as @daily. The day of
// month also takes Quartz's L, L-n, LW and nW, the day of week nL and n#k
// (with cron's weekday numbers), and any field H (see ParseCronFor).
type Cron struct {
	cal  calendar
	expr string // as parsed, H resolved
	// written is the expression with its H, when it had any.
	written string
}

// ParseCron parses expr with robfig/cron's standard parser and evaluates it
// on loc's wall clock with beatd's DST policy. An H in it is an error: H
// needs an entry's name (ParseCronFor).
func ParseCron(expr string, loc *time.Location) (*Cron, error) {
	return ParseCronFor(expr, "", loc)
}

// ParseCronFor is ParseCron for the entry called name: an H in a field is
// resolved with the hash of name (see SpreadHash) before anything else.
func ParseCronFor(expr, name string, loc *time.Location) (*Cron, error) {
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
	resolved, hashed, err := ResolveCronSpread(trimmed, name)
	if err != nil {
		return nil, err
	}
	fields := strings.Fields(resolved)
	domAt, dowAt := -1, -1
	switch len(fields) {
	case 5:
		domAt, dowAt = 2, 4
	case 6:
		domAt, dowAt = 3, 5
	}
	var rules dayRules
	var domRest, dowRest []string
	if domAt >= 0 {
		if domRest, err = rules.splitDom(fields[domAt]); err == nil {
			dowRest, err = rules.splitDow(fields[dowAt])
		}
		if err != nil {
			return nil, fmt.Errorf("cron %q: %w", expr, err)
		}
		// What robfig/cron reads: the fields without their rules ("*" in
		// place of a field that was all rules, and no day bit from it).
		fields[domAt] = orStar(domRest)
		fields[dowAt] = orStar(dowRest)
	}
	sched, err := cronParser.Parse(strings.Join(fields, " "))
	if err != nil {
		return nil, fmt.Errorf("cron %q: %w", expr, err)
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron %q: unsupported schedule", expr)
	}
	dom, dow := spec.Dom&^cronStar, spec.Dow&^cronStar
	domSet := spec.Dom&cronStar == 0 || rules.hasDom()
	dowSet := spec.Dow&cronStar == 0 || rules.hasDow()
	if rules.hasDom() && len(domRest) == 0 {
		dom = 0
	}
	if rules.hasDow() && len(dowRest) == 0 {
		dow = 0
	}
	c := &Cron{expr: resolved, cal: calendar{
		second:  spec.Second &^ cronStar,
		minute:  spec.Minute &^ cronStar,
		hour:    uint32(spec.Hour &^ cronStar),
		dom:     uint32(dom),
		month:   uint16(spec.Month &^ cronStar),
		dow:     uint8(dow),
		orDays:  domSet && dowSet,
		seconds: true,
		loc:     loc,
	}}
	if hashed {
		c.written = trimmed
	}
	if rules.hasDom() || rules.hasDow() {
		c.cal.rules = &rules
	}
	if !c.cal.canFire() {
		return nil, fmt.Errorf("cron %q can never fire: no date matches its day and month fields", expr)
	}
	return c, nil
}

func orStar(parts []string) string {
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, ",")
}

// Next returns the first slot strictly after t.
func (c *Cron) Next(t time.Time) time.Time { return c.cal.Next(t) }

// Location is the zone whose wall clock the fields are matched against.
func (c *Cron) Location() *time.Location { return c.cal.loc }

// Expr is the expression the cron fires by, its H resolved.
func (c *Cron) Expr() string { return c.expr }

// Written is the expression as written when it had an H, else "".
func (c *Cron) Written() string { return c.written }

// String is "cron(EXPR)", and for an expression with H "cron(EXPR) from
// WRITTEN", so a reader sees both what was written and what it resolved to.
func (c *Cron) String() string {
	if c.written != "" {
		return "cron(" + c.expr + ") from " + c.written
	}
	return "cron(" + c.expr + ")"
}
