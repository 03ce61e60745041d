package migrate

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/schedule"
)

// State is what celery beat last sent for an entry, in beatd's terms: the
// nominal slot it fired (for an interval, the send time, on which the
// import anchors the grid).
type State struct {
	Name      string
	LastSlot  time.Time
	LastRunAt time.Time // celery beat's send time, for the report
	Count     int64
}

// Result is a converted schedule.
type Result struct {
	YAML     string
	Warnings []string // one line each, naming the entry
	States   []State  // entries with a known last send
	Config   *config.Config
	Checks   []Check  // per converted entry, for --check
	Skipped  []string // entries not converted (commented out in YAML)
}

// Check pairs a converted entry with its Celery schedule, for comparing
// fire times.
type Check struct {
	Name  string // beatd's name
	Zone  string
	Sched Sched
	From  time.Time // the chain's start: the last send, else the check's start
	Entry *config.Entry
	// Documented names the deviation every difference on this entry is
	// (a known approximation the conversion notes), or "".
	Documented string
}

// Options tune a conversion.
type Options struct {
	Now time.Time // for one-off entries that have not run yet
}

// Convert turns a source into schedules.yaml text.
func Convert(src *Source, opt Options) (*Result, error) {
	if opt.Now.IsZero() {
		opt.Now = time.Now()
	}
	res := &Result{Warnings: append([]string(nil), src.Warnings...)}
	zone := src.Timezone
	if zone == "" {
		zone = "UTC"
	}
	if _, err := time.LoadLocation(zone); err != nil {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the app's timezone %q is not an IANA zone beatd knows; using UTC", zone))
		zone = "UTC"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Imported by `beatd import` from %s (%s).\n", src.Origin, src.Kind)
	for _, n := range src.Notes {
		fmt.Fprintf(&b, "# %s\n", n)
	}
	fmt.Fprintf(&b, "timezone: %s\nentries:\n", quote(zone))

	entries := append([]*Entry(nil), src.Entries...)
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	used := map[string]bool{}
	for _, e := range entries {
		name, renamed := beatdName(e.Name, used)
		used[name] = true
		c := &conv{e: e, name: name, zone: zone, now: opt.Now}
		if renamed {
			c.warn("renamed to %q: beatd entry names cannot contain '/', NUL or surrounding spaces", name)
		}
		block, err := c.block()
		if err == nil {
			// Each entry must pass beatd's own validation on its own.
			var cfg *config.Config
			cfg, err = config.Parse("import", []byte("timezone: "+quote(zone)+"\nentries:\n"+block))
			if err == nil {
				c.parsed = cfg.Entries[0]
			}
		}
		if err != nil {
			c.warn("not imported: %v", err)
			res.Skipped = append(res.Skipped, e.Name)
			b.WriteString(commentOut(c.comments, e, err))
			res.Warnings = append(res.Warnings, c.warnings...)
			continue
		}
		b.WriteString(block)
		res.Warnings = append(res.Warnings, c.warnings...)
		if st, ok := c.state(); ok {
			res.States = append(res.States, st)
		}
		if e.OneOff && e.Sched.Type != "clocked" {
			continue // converted to a one-off `at`, warned: nothing to compare
		}
		// Both sides chain from the last send, else from now; an entry
		// that starts later starts there.
		from := opt.Now.Truncate(time.Second)
		if !e.LastRunAt.IsZero() {
			from = e.LastRunAt
		}
		if e.Start.After(from) {
			from = e.Start
		}
		ez := zone
		if e.Zone != "" {
			ez = e.Zone
		}
		res.Checks = append(res.Checks, Check{Name: name, Zone: ez, Sched: e.Sched, From: from, Entry: c.parsed, Documented: c.documented})
	}
	res.YAML = b.String()
	cfg, err := config.Parse("import", []byte(res.YAML))
	if err != nil {
		return nil, fmt.Errorf("migrate: the converted file does not validate (a bug): %w", err)
	}
	res.Config = cfg
	for i := range res.Checks {
		res.Checks[i].Entry = cfg.Entry(res.Checks[i].Name)
	}
	return res, nil
}

// beatdName makes a Celery entry name acceptable to beatd, and unique.
func beatdName(name string, used map[string]bool) (string, bool) {
	n := strings.TrimSpace(strings.NewReplacer("/", "-", "\x00", "").Replace(name))
	if n == "" {
		n = "entry"
	}
	base := n
	for i := 2; used[n]; i++ {
		n = fmt.Sprintf("%s-%d", base, i)
	}
	return n, n != name
}

// conv converts one entry.
type conv struct {
	e        *Entry
	name     string
	zone     string
	now      time.Time
	comments []string // lines for the YAML, without "# "
	warnings []string
	anchor   time.Time // interval grid anchor written as start_at
	parsed   *config.Entry
	// documented: the deviation --check attributes this entry's
	// differences to, or "".
	documented string
}

// DeviationStartTimePast is the documented deviation of a
// django-celery-beat interval whose start_time has passed and that never
// ran: django-celery-beat first runs it one interval after beat starts,
// beatd on the start_time + k*interval grid.
const DeviationStartTimePast = "django_start_time_past"

func (c *conv) warn(format string, args ...any) {
	c.warnings = append(c.warnings, fmt.Sprintf("entry %q: ", c.e.Name)+fmt.Sprintf(format, args...))
}

func (c *conv) note(format string, args ...any) {
	c.comments = append(c.comments, fmt.Sprintf(format, args...))
}

// block renders the entry as YAML lines under entries:.
func (c *conv) block() (string, error) {
	e := c.e
	if strings.TrimSpace(e.Task) == "" {
		return "", fmt.Errorf("no task name")
	}
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, "    "+fmt.Sprintf(format, args...)) }
	chain, _ := unchain(e)
	add("task: %s", quote(e.Task))
	if e.Zone != "" && e.Zone != c.zone {
		add("timezone: %s", quote(e.Zone))
	}
	if err := c.schedule(add); err != nil {
		return "", err
	}
	if !e.Enabled {
		add("enabled: false")
	}
	if len(e.Args) > 0 && strings.TrimSpace(string(e.Args)) != "[]" {
		s, err := canonical(e.Args)
		if err != nil {
			return "", fmt.Errorf("args: %w", err)
		}
		add("args: %s", s)
	}
	if len(e.Kwargs) > 0 && strings.TrimSpace(string(e.Kwargs)) != "{}" {
		s, err := canonical(e.Kwargs)
		if err != nil {
			return "", fmt.Errorf("kwargs: %w", err)
		}
		add("kwargs: %s", s)
	}
	if opts, err := c.options(); err != nil {
		return "", err
	} else if opts != "" {
		add("options: {%s}", opts)
	}
	c.canvas(add, chain)
	for _, p := range e.Problems {
		c.warn("value not carried faithfully: %s", p)
		c.note("approximation: %s", p)
	}
	var b strings.Builder
	if e.Comment != "" {
		for _, l := range strings.Split(strings.TrimSpace(e.Comment), "\n") {
			fmt.Fprintf(&b, "  # %s\n", l)
		}
	}
	if c.name != e.Name {
		fmt.Fprintf(&b, "  # Celery name: %s\n", quote(e.Name))
	}
	for _, l := range c.comments {
		fmt.Fprintf(&b, "  # %s\n", l)
	}
	fmt.Fprintf(&b, "  %s:\n", quote(c.name))
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return b.String(), nil
}

func (c *conv) schedule(add func(string, ...any)) error {
	e := c.e
	s := e.Sched
	if e.OneOff && s.Type != "clocked" {
		return c.oneOff(add)
	}
	switch s.Type {
	case "crontab":
		add("crontab: {minute: %s, hour: %s, day_of_week: %s, day_of_month: %s, month_of_year: %s}",
			quote(s.Minute), quote(s.Hour), quote(s.DayOfWeek), quote(s.DayOfMonth), quote(s.MonthOfYear))
		if !e.Start.IsZero() {
			add("start_at: %s", quote(e.Start.Format(time.RFC3339Nano)))
		}
	case "interval":
		if s.Seconds <= 0 || math.IsNaN(s.Seconds) || math.IsInf(s.Seconds, 0) {
			return fmt.Errorf("interval of %v seconds", s.Seconds)
		}
		add("every: %s", formatSeconds(s.Seconds))
		switch {
		case s.Relative:
			add("relative: true")
			c.note("approximation: Celery's relative=True rounds the last run down to the interval's largest unit (day, hour, minute or second) before adding the interval; beatd's relative grid counts from the Unix epoch (the same slots when the interval divides that unit)")
		case !e.LastRunAt.IsZero() && !e.LastRunAt.Before(e.Start):
			c.anchor = e.LastRunAt.UTC()
			add("start_at: %s", quote(c.anchor.Format(time.RFC3339Nano)))
			c.note("start_at is the last send: beatd's first send comes one interval after it")
		case !e.Start.IsZero():
			c.anchor = e.Start.UTC()
			add("start_at: %s", quote(c.anchor.Format(time.RFC3339Nano)))
			c.note("approximation: django-celery-beat first runs this at its start_time or one interval after beat started, whichever is later; beatd runs it at start_time + k*interval")
			if e.Start.Before(c.now) {
				// Past start_time, never run: django-celery-beat's grid
				// starts when beat starts, which no file can say; beatd
				// keeps the start_time grid. --check names it rather than
				// failing on it.
				c.documented = DeviationStartTimePast
			}
		}
	case "solar":
		add("solar: {event: %s, lat: %s, lon: %s}", quote(s.Event), strconv.FormatFloat(s.Lat, 'f', -1, 64), strconv.FormatFloat(s.Lon, 'f', -1, 64))
		if s.Event == "dusk_astronomical" {
			c.note("deviation: Celery 5.2.6 computes dusk_astronomical with the horizon +18 degrees (a typo); beatd uses -18")
		}
		if !e.Start.IsZero() {
			add("start_at: %s", quote(e.Start.Format(time.RFC3339Nano)))
		}
	case "clocked":
		add("at: %s", quote(s.At.Format(time.RFC3339Nano)))
		if ran := e.TotalRunCount > 0 || (!e.LastRunAt.IsZero() && !e.LastRunAt.Before(s.At)); ran && e.Enabled {
			e.Enabled = false
			c.note("already ran at %s: disabled", e.LastRunAt.Format(time.RFC3339))
		}
	default:
		return fmt.Errorf("schedule %s has no beatd equivalent", s.Repr)
	}
	if !e.End.IsZero() && s.Type != "clocked" {
		if !e.Start.IsZero() && !e.End.After(e.Start) {
			c.note("expires %s is not after start_time: the entry never runs", e.End.Format(time.RFC3339))
			e.Enabled = false
		} else {
			add("end_at: %s", quote(e.End.Format(time.RFC3339Nano)))
		}
	}
	return nil
}

// oneOff: django-celery-beat's one_off runs a crontab, interval or solar
// entry once and then disables it. beatd expresses that as `at` the next
// fire time.
func (c *conv) oneOff(add func(string, ...any)) error {
	e := c.e
	if !e.Enabled || e.TotalRunCount > 0 || !e.LastRunAt.IsZero() {
		if e.Enabled {
			e.Enabled = false
		}
		// A placeholder at the time it ran (or now): it is disabled.
		at := e.LastRunAt
		if at.IsZero() {
			at = c.now.UTC().Truncate(time.Second)
		}
		add("at: %s", quote(at.Format(time.RFC3339Nano)))
		c.note("one_off %s entry that already ran (or is disabled): kept disabled", e.Sched.Type)
		return nil
	}
	probe := *c
	probe.e = &Entry{Name: e.Name, Task: e.Task, Sched: e.Sched, Zone: e.Zone, Enabled: true, Start: e.Start}
	var lines []string
	if err := probe.schedule(func(f string, a ...any) { lines = append(lines, "    "+fmt.Sprintf(f, a...)) }); err != nil {
		return err
	}
	cfg, err := config.Parse("one_off", []byte("timezone: "+quote(c.zone)+"\nentries:\n  x:\n    task: t\n"+strings.Join(lines, "\n")+"\n"))
	if err != nil {
		return err
	}
	if next := schedule.Anchor(cfg.Entries[0].Schedule, c.now).Next(c.now); next.IsZero() {
		return fmt.Errorf("one_off %s schedule never fires", e.Sched.Type)
	}
	// The schedule itself, limited to one run: beatd fires it at its next
	// slot, as django-celery-beat does, and then shows it finished.
	for _, l := range lines {
		add("%s", strings.TrimPrefix(l, "    "))
	}
	add("max_runs: 1")
	c.note("one_off: max_runs: 1 (it fires once, at its next slot, then is finished)")
	return nil
}

// knownOptions are the send options schedules.yaml carries.
var knownOptions = map[string]bool{"queue": true, "exchange": true, "routing_key": true, "priority": true,
	"expires": true, "headers": true, "time_limit": true, "soft_time_limit": true, "ignore_result": true}

func (c *conv) options() (string, error) {
	var parts, dropped []string
	for _, o := range c.e.Options {
		v := strings.TrimSpace(string(o.Value))
		if v == "null" || v == `""` || o.Key == "link" || o.Key == "link_error" {
			continue // link and link_error: canvas
		}
		if !knownOptions[o.Key] {
			dropped = append(dropped, o.Key+"="+v)
			continue
		}
		s, err := canonical(o.Value)
		if err != nil {
			return "", fmt.Errorf("option %s: %w", o.Key, err)
		}
		// An option beatd rejects (a priority of 12, a zero expires)
		// is dropped, not the whole entry.
		probe := "entries:\n  x: {task: t, every: 1s, options: {" + o.Key + ": " + s + "}}\n"
		if _, err := config.Parse("option", []byte(probe)); err != nil {
			dropped = append(dropped, o.Key+"="+v+" ("+optionError(err)+")")
			continue
		}
		parts = append(parts, o.Key+": "+s)
	}
	if len(dropped) > 0 {
		c.warn("options beatd does not send, dropped: %s", strings.Join(dropped, ", "))
		c.note("not imported: options %s", strings.Join(dropped, ", "))
	}
	return strings.Join(parts, ", "), nil
}

// optionError is a validation message without its position in the probe.
func optionError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, ": "); i >= 0 && strings.HasPrefix(msg, "option:") {
		msg = msg[i+2:]
		if j := strings.Index(msg, ": "); j >= 0 {
			msg = msg[j+2:]
		}
	}
	return msg
}

// state returns the entry's last send in beatd's terms.
func (c *conv) state() (State, bool) {
	e := c.e
	if e.LastRunAt.IsZero() || c.parsed == nil {
		return State{}, false
	}
	st := State{Name: c.name, LastRunAt: e.LastRunAt, Count: e.TotalRunCount}
	switch {
	case !c.anchor.IsZero():
		st.LastSlot = c.anchor // the grid starts there: it is a slot
	case e.Sched.Type == "solar":
		// ephem's event and beatd's differ by seconds: the slot celery
		// beat sent is the latest beatd slot up to a minute after its send.
		st.LastSlot = latestSlot(c.parsed.Schedule, e.LastRunAt.Add(time.Minute))
	default:
		st.LastSlot = latestSlot(c.parsed.Schedule, e.LastRunAt)
	}
	if st.LastSlot.IsZero() {
		return State{}, false
	}
	return st, true
}

// latestSlot is the latest slot of s at or before t, looking back up to
// about 400 days; zero if there is none.
func latestSlot(s schedule.Schedule, t time.Time) time.Time {
	for back := time.Hour; back <= 400*24*time.Hour; back *= 4 {
		m := schedule.Missed(s, t.Add(-back), t, 1)
		if len(m.Slots) > 0 {
			return m.Slots[0]
		}
	}
	return time.Time{}
}

// formatSeconds writes an interval the way people read it: 30s, 5m,
// 1h30m, 2d, 1w; fractions of a second as Go writes them (500ms).
func formatSeconds(secs float64) string {
	if secs != math.Trunc(secs) || secs < 1 {
		return time.Duration(secs * float64(time.Second)).String()
	}
	n := int64(secs)
	var b strings.Builder
	for _, u := range []struct {
		size int64
		name string
	}{{7 * 86400, "w"}, {86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}} {
		if n >= u.size {
			fmt.Fprintf(&b, "%d%s", n/u.size, u.name)
			n %= u.size
		}
	}
	return b.String()
}

// commentOut keeps an entry that could not be converted visible in the
// YAML, commented out.
func commentOut(comments []string, e *Entry, why error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  # NOT IMPORTED: %s: %v\n", quote(e.Name), why)
	for _, l := range comments {
		fmt.Fprintf(&b, "  #   %s\n", l)
	}
	raw, _ := json.Marshal(map[string]any{"task": e.Task, "schedule": e.Sched.checkJSON(), "repr": e.Sched.Repr})
	fmt.Fprintf(&b, "  #   celery: %s\n", raw)
	return b.String()
}
