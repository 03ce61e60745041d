package schedule

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Describe says when a schedule fires in words, for people: "every 5 s",
// "at 02:30 Mon–Fri (America/New_York)". It is a summary, not a parser
// input; the entry's definition remains the authority.
func Describe(s Schedule) string {
	switch s := s.(type) {
	case *Every:
		d := "every " + WordsDuration(s.Interval)
		if !s.Anchor.IsZero() {
			d += " from " + s.Anchor.UTC().Format("2006-01-02 15:04:05Z")
		}
		return d
	case *At:
		return "once at " + s.Time.Format("2006-01-02 15:04:05 -07:00")
	case *Crontab:
		return s.cal.describe()
	case *Cron:
		return s.cal.describe()
	case *NotBefore:
		return Describe(s.Schedule) + ", not before " + s.Start.Format("2006-01-02 15:04 -07:00")
	case *Until:
		return Describe(s.Schedule) + ", until " + s.End.Format("2006-01-02 15:04 -07:00")
	case Never:
		return "never"
	case nil:
		return "never"
	}
	return fmt.Sprint(s)
}

// WordsDuration writes a duration as "5 s", "1 h 30 min", "250 ms".
func WordsDuration(d time.Duration) string {
	if d <= 0 {
		return "0 s"
	}
	if d < time.Second || d%time.Second != 0 && d < time.Minute {
		if d%time.Millisecond == 0 {
			return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
		}
		return d.String()
	}
	var parts []string
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "min"}, {time.Second, "s"}} {
		if n := d / u.d; n > 0 {
			parts = append(parts, strconv.FormatInt(int64(n), 10)+" "+u.name)
			d -= n * u.d
		}
	}
	if d > 0 {
		parts = append(parts, d.String())
	}
	return strings.Join(parts, " ")
}

var dayAbbr = [7]string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}
var monthAbbr = [13]string{"", "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}

func (c *calendar) describe() string {
	var b []string
	b = append(b, c.describeTime())
	dowFull := c.dow == 0x7f
	domFull := c.dom == 0xfffffffe
	days := describeSetWith(uint64(c.dow), 0, 7, func(v int) string { return dayAbbr[v] })
	doms := "day " + describeSetWith(uint64(c.dom), 1, 31, strconv.Itoa)
	switch {
	case c.rules != nil:
		// L, W and # days: a day-of-month or day-of-week field that is
		// "*" adds nothing, and the rest are alternatives (Vixie's OR) or
		// the only restriction.
		var alts []string
		if c.dom != 0 && !domFull {
			alts = append(alts, doms)
		}
		if c.dow != 0 && !dowFull {
			alts = append(alts, days)
		}
		b = append(b, "on "+strings.Join(append(alts, c.rules.describe()...), " or "))
	case dowFull && domFull:
	case domFull:
		b = append(b, days)
	case dowFull:
		b = append(b, "on "+doms)
	case c.orDays:
		b = append(b, "on "+doms+" or "+days)
	default:
		b = append(b, "on "+doms+" if "+days)
	}
	if c.month != 0x1ffe {
		b = append(b, "in "+describeSetWith(uint64(c.month), 1, 12, func(v int) string { return monthAbbr[v] }))
	}
	zone := "UTC"
	if c.loc != nil {
		zone = c.loc.String()
	}
	return strings.Join(b, " ") + " (" + zone + ")"
}

// describeTime covers seconds, minutes and hours.
func (c *calendar) describeTime() string {
	const allMinutes = 1<<60 - 1
	const allHours = 1<<24 - 1
	sec := c.second
	if !c.seconds {
		sec = 1
	}
	minute, hour := c.minute, uint64(c.hour)
	if sec != 1 {
		// Seconds other than :00 only come from six-field cron specs.
		s := "at second " + describeSetWith(sec, 0, 60, strconv.Itoa)
		if sec == allMinutes {
			s = "every second"
		} else if k := stepOf(sec, 60); k > 0 {
			s = "every " + strconv.Itoa(k) + " s"
		}
		if minute == allMinutes && hour == allHours {
			return s
		}
		return s + " of minute " + describeSetWith(minute, 0, 60, strconv.Itoa) + " of hour " + describeSetWith(hour, 0, 24, strconv.Itoa)
	}
	if hour == allHours {
		switch {
		case minute == allMinutes:
			return "every minute"
		case stepOf(minute, 60) > 0:
			return "every " + strconv.Itoa(stepOf(minute, 60)) + " min"
		case bits.OnesCount64(minute) <= 4:
			return "hourly at " + listBits(minute, 0, 60, func(v int) string { return fmt.Sprintf(":%02d", v) })
		}
		return "at minute " + describeSetWith(minute, 0, 60, strconv.Itoa) + " of every hour"
	}
	if n := bits.OnesCount64(minute) * bits.OnesCount64(hour); n <= 6 {
		var times []string
		for h := 0; h < 24; h++ {
			for m := 0; m < 60; m++ {
				if hour&(1<<h) != 0 && minute&(1<<m) != 0 {
					times = append(times, fmt.Sprintf("%02d:%02d", h, m))
				}
			}
		}
		return "at " + strings.Join(times, ", ")
	}
	m := "every minute"
	if minute != allMinutes {
		m = "at minute " + describeSetWith(minute, 0, 60, strconv.Itoa)
	}
	return m + " of hour " + describeSetWith(hour, 0, 24, strconv.Itoa)
}

// stepOf returns k when set is exactly {0, k, 2k, ...} below size and k>1
// divides size, else 0.
func stepOf(set uint64, size int) int {
	if set&1 == 0 || bits.OnesCount64(set) < 2 {
		return 0
	}
	k := bits.TrailingZeros64(set &^ 1)
	if size%k != 0 {
		return 0
	}
	var want uint64
	for v := 0; v < size; v += k {
		want |= 1 << v
	}
	if set != want {
		return 0
	}
	return k
}

func listBits(set uint64, lo, size int, name func(int) string) string {
	var out []string
	for v := lo; v < lo+size; v++ {
		if set&(1<<v) != 0 {
			out = append(out, name(v))
		}
	}
	return strings.Join(out, ", ")
}

// describeSetWith writes a set as comma-separated values and ranges
// (en dash), naming each value with name.
func describeSetWith(set uint64, lo, size int, name func(int) string) string {
	var parts []string
	for v := lo; v < lo+size; v++ {
		if set&(1<<v) == 0 {
			continue
		}
		end := v
		for end+1 < lo+size && set&(1<<(end+1)) != 0 {
			end++
		}
		switch {
		case end >= v+2:
			parts = append(parts, name(v)+"–"+name(end))
		case end == v+1:
			parts = append(parts, name(v), name(end))
		default:
			parts = append(parts, name(v))
		}
		v = end
	}
	return strings.Join(parts, ", ")
}
