package schedule

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// dayRules are Quartz's day forms that a bit per day cannot hold, because
// which day they name depends on the month: L, L-n, LW and nW in the day
// of month, nL and n#k in the day of week. robfig/cron, which parses the
// rest of a cron expression, does not read them, and no maintained Go
// cron library evaluates them with a DST policy of its own, so they are
// matched here, day by day, beside the calendar's bit sets.
type dayRules struct {
	domLast     uint32   // bit k: the day k days before the month's last (L-k; L is k = 0)
	domNearest  uint32   // bits 1-31: the weekday nearest that day (nW)
	lastWeekday bool     // LW: the month's last Monday-to-Friday day
	dowLast     uint8    // bits 0-6: the month's last such weekday (nL)
	dowNth      [7]uint8 // per weekday, bits 1-5: its k-th in the month (n#k)
	text        []string // the forms as written, for Describe
}

var (
	reDomLastBefore = regexp.MustCompile(`^L-(\d{1,2})$`)
	reDomNearest    = regexp.MustCompile(`^(\d{1,2})W$`)
	reDowLast       = regexp.MustCompile(`^([0-9]|[A-Z]{3})L$`)
	reDowNth        = regexp.MustCompile(`^([0-9]|[A-Z]{3})#(\d)$`)
	cronWeekdays    = map[string]int{"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
)

// cronWeekday reads a weekday as cron numbers it (0 or 7 is Sunday, 5 is
// Friday; not Quartz's 1 = Sunday) or by its three-letter name.
func cronWeekday(s string) (int, error) {
	if v, ok := cronWeekdays[s]; ok {
		return v, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v > 7 {
		return 0, fmt.Errorf("%q is not a weekday: want 0-7 (0 and 7 are Sunday) or SUN-SAT", s)
	}
	return v % 7, nil
}

// splitDom takes the L and W parts out of a day-of-month field and returns
// what is left for robfig/cron.
func (r *dayRules) splitDom(field string) (rest []string, err error) {
	for _, part := range strings.Split(field, ",") {
		up := strings.ToUpper(part)
		switch {
		case up == "L":
			r.domLast |= 1
		case up == "LW":
			r.lastWeekday = true
		case reDomLastBefore.MatchString(up):
			k, _ := strconv.Atoi(reDomLastBefore.FindStringSubmatch(up)[1])
			if k > 30 {
				return nil, fmt.Errorf("day of month %q: L-N counts at most 30 days back", part)
			}
			r.domLast |= 1 << uint(k)
		case reDomNearest.MatchString(up):
			d, _ := strconv.Atoi(reDomNearest.FindStringSubmatch(up)[1])
			if d < 1 || d > 31 {
				return nil, fmt.Errorf("day of month %q: NW needs a day 1-31", part)
			}
			r.domNearest |= 1 << uint(d)
		case strings.ContainsAny(up, "LW#"):
			return nil, fmt.Errorf("day of month %q: want L, L-N, LW or NW (such as 15W), alone in its comma part", part)
		default:
			rest = append(rest, part)
			continue
		}
		r.text = append(r.text, up)
	}
	return rest, nil
}

// splitDow takes the L and # parts out of a day-of-week field.
func (r *dayRules) splitDow(field string) (rest []string, err error) {
	for _, part := range strings.Split(field, ",") {
		up := strings.ToUpper(part)
		switch {
		case up == "L":
			return nil, fmt.Errorf("day of week %q: L alone is ambiguous here; write the weekday before it, such as FRIL or 5L for the last Friday", part)
		case reDowLast.MatchString(up):
			wd, err := cronWeekday(reDowLast.FindStringSubmatch(up)[1])
			if err != nil {
				return nil, fmt.Errorf("day of week %q: %w", part, err)
			}
			r.dowLast |= 1 << uint(wd)
		case reDowNth.MatchString(up):
			m := reDowNth.FindStringSubmatch(up)
			wd, err := cronWeekday(m[1])
			if err != nil {
				return nil, fmt.Errorf("day of week %q: %w", part, err)
			}
			k, _ := strconv.Atoi(m[2])
			if k < 1 || k > 5 {
				return nil, fmt.Errorf("day of week %q: #K counts the weekday's 1st to 5th in the month", part)
			}
			r.dowNth[wd] |= 1 << uint(k)
		case strings.ContainsAny(up, "#") || strings.HasSuffix(up, "L") && !strings.Contains(up, "-"):
			return nil, fmt.Errorf("day of week %q: want a weekday then L (FRIL, 5L) or #K (MON#2, 1#2), alone in its comma part", part)
		default:
			rest = append(rest, part)
			continue
		}
		r.text = append(r.text, up)
	}
	return rest, nil
}

func (r *dayRules) hasDom() bool { return r.domLast != 0 || r.domNearest != 0 || r.lastWeekday }

func (r *dayRules) hasDow() bool {
	return r.dowLast != 0 || r.dowNth != [7]uint8{}
}

// dom reports whether day d of month m of year y, a weekday wd, is one the
// day-of-month rules name.
func (r *dayRules) dom(y, m, d, wd int) bool {
	last := daysIn(y, m)
	if k := last - d; k <= 30 && r.domLast&(1<<uint(k)) != 0 {
		return true
	}
	if r.lastWeekday && d == nearestWeekday(y, m, last, last) {
		return true
	}
	if r.domNearest != 0 && wd >= 1 && wd <= 5 {
		// Only d and the weekend days beside it can move onto d.
		for n := max(1, d-2); n <= min(last, d+2); n++ {
			if r.domNearest&(1<<uint(n)) != 0 && nearestWeekday(y, m, n, last) == d {
				return true
			}
		}
	}
	return false
}

// dow reports whether day d, a weekday wd, is one the day-of-week rules
// name.
func (r *dayRules) dow(y, m, d, wd int) bool {
	if r.dowLast&(1<<uint(wd)) != 0 && d+7 > daysIn(y, m) {
		return true
	}
	return r.dowNth[wd]&(1<<uint((d-1)/7+1)) != 0
}

// nearestWeekday is Quartz's nW: day n if it is Monday to Friday, else the
// nearest such day in the same month (a Saturday moves back to Friday
// unless that leaves the month, a Sunday forward to Monday likewise).
func nearestWeekday(y, m, n, last int) int {
	switch weekdayOf(daysFromCivil(y, m, n)) {
	case 6:
		if n == 1 {
			return 3
		}
		return n - 1
	case 0:
		if n == last {
			return n - 2
		}
		return n + 1
	}
	return n
}

// describe names the rules in words, in the order written.
func (r *dayRules) describe() []string {
	out := make([]string, 0, len(r.text))
	for _, t := range r.text {
		switch {
		case t == "L":
			out = append(out, "the last day")
		case t == "LW":
			out = append(out, "the last weekday")
		case strings.HasPrefix(t, "L-"):
			out = append(out, t[2:]+" days before the last day")
		case strings.HasSuffix(t, "W"):
			out = append(out, "the weekday nearest day "+strings.TrimSuffix(t, "W"))
		case strings.HasSuffix(t, "L"):
			wd, _ := cronWeekday(strings.TrimSuffix(t, "L"))
			out = append(out, "the last "+dayAbbr[wd])
		default:
			wdS, kS, _ := strings.Cut(t, "#")
			wd, _ := cronWeekday(wdS)
			out = append(out, "the "+ordinal(kS)+" "+dayAbbr[wd])
		}
	}
	return out
}

func ordinal(k string) string {
	switch k {
	case "1":
		return "1st"
	case "2":
		return "2nd"
	case "3":
		return "3rd"
	}
	return k + "th"
}
