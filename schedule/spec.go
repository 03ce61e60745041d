package schedule

import (
	"math/bits"
	"time"
)

// searchYears bounds how far Next looks ahead. Rare but valid specs (Feb 29
// on a Monday) recur within 40 years; config validation rejects specs that
// can never fire, so the bound only guards against surprises.
const searchYears = 100

// calendar matches wall-clock fields with bit sets. Celery's crontab and
// Vixie cron share it and differ only in how day-of-month and day-of-week
// combine, and in whether seconds count.
type calendar struct {
	second  uint64 // bits 0-59
	minute  uint64 // bits 0-59
	hour    uint32 // bits 0-23
	dom     uint32 // bits 1-31
	month   uint16 // bits 1-12
	dow     uint8  // bits 0-6, Sunday = 0
	orDays  bool   // Vixie: a day matches on dom OR dow (both restricted)
	seconds bool   // slots fall on seconds, not whole minutes
	loc     *time.Location
	// rules, when set, are cron's L, W and # days, matched beside dom
	// (day of month) and dow (day of week).
	rules *dayRules
}

// nextBit returns the lowest set bit of set at position >= from, or -1.
func nextBit(set uint64, from int) int {
	if from > 63 {
		return -1
	}
	set = set >> uint(from) << uint(from)
	if set == 0 {
		return -1
	}
	return bits.TrailingZeros64(set)
}

func (c *calendar) dayMatches(days int64, y, m, d int) bool {
	wd := weekdayOf(days)
	domOK := c.dom&(1<<uint(d)) != 0
	dowOK := c.dow&(1<<uint(wd)) != 0
	if r := c.rules; r != nil {
		domOK = domOK || r.dom(y, m, d, wd)
		dowOK = dowOK || r.dow(y, m, d, wd)
	}
	if c.orDays {
		return domOK || dowOK
	}
	return domOK && dowOK
}

// Next returns the first slot strictly after t, or the zero time if there is
// none within searchYears.
func (c *calendar) Next(t time.Time) time.Time {
	u := t.Unix()
	hint := spanAt(u, c.loc)
	w := u + hint.off
	if c.seconds {
		w++
	} else {
		w = floorDiv(w, 60)*60 + 60
	}
	for guard := 0; guard < 8; guard++ {
		cand, ok := c.nextWall(w)
		if !ok {
			return time.Time{}
		}
		r := resolve(cand, c.loc, hint)
		if r > u {
			return time.Unix(r, 0).In(c.loc)
		}
		// The wall time's first occurrence is already past (t lies in a
		// fall-back overlap): by policy it does not fire again.
		if c.seconds {
			w = cand + 1
		} else {
			w = cand + 60
		}
	}
	return time.Time{}
}

// nextWall returns the first matching wall time at or after local seconds w.
func (c *calendar) nextWall(w int64) (int64, bool) {
	days := floorDiv(w, secondsPerDay)
	sod := int(w - days*secondsPerDay)
	y, m, d := civilFromDays(days)
	h, mi, s := sod/3600, sod/60%60, sod%60
	limit := y + searchYears

	nextDay := func() {
		d++
		days++
		if d > daysIn(y, m) {
			d = 1
			m++
			if m > 12 {
				m = 1
				y++
			}
		}
		h, mi, s = 0, 0, 0
	}
	for y <= limit {
		if c.month&(1<<uint(m)) == 0 {
			nm := nextBit(uint64(c.month), m+1)
			if nm < 0 {
				y++
				nm = nextBit(uint64(c.month), 1)
			}
			m, d, h, mi, s = nm, 1, 0, 0, 0
			days = daysFromCivil(y, m, d)
			continue
		}
		if !c.dayMatches(days, y, m, d) {
			nextDay()
			continue
		}
		if c.hour&(1<<uint(h)) == 0 {
			nh := nextBit(uint64(c.hour), h+1)
			if nh < 0 {
				nextDay()
				continue
			}
			h, mi, s = nh, 0, 0
		}
		if c.minute&(1<<uint(mi)) == 0 {
			nm := nextBit(c.minute, mi+1)
			if nm < 0 {
				h++
				mi, s = 0, 0
				if h > 23 {
					nextDay()
				}
				continue
			}
			mi, s = nm, 0
		}
		if c.second&(1<<uint(s)) == 0 {
			ns := nextBit(c.second, s+1)
			if ns < 0 {
				mi++
				s = 0
				if mi > 59 {
					mi = 0
					h++
					if h > 23 {
						nextDay()
					}
				}
				continue
			}
			s = ns
		}
		return days*secondsPerDay + int64(h*3600+mi*60+s), true
	}
	return 0, false
}

// canFire reports whether some calendar date can ever match, ignoring the
// time of day: Feb 29 exists, and every (month, day) falls on every weekday
// within the 400-year Gregorian cycle.
func (c *calendar) canFire() bool {
	if c.second == 0 || c.minute == 0 || c.hour == 0 || c.month == 0 {
		return false
	}
	if c.rules != nil {
		return c.rulesCanFire()
	}
	if c.orDays && c.dow != 0 {
		return true
	}
	if c.dow == 0 {
		return false
	}
	for m := 1; m <= 12; m++ {
		if c.month&(1<<uint(m)) == 0 {
			continue
		}
		maxDay := daysIn(2000, m) // 2000 is a leap year
		if c.dom&(uint32(1)<<uint(maxDay+1)-2) != 0 {
			return true
		}
	}
	return false
}

// rulesCanFire is canFire for a calendar with L, W or # days: it tries
// every day of 2000 to 2027, which hold every kind of year (a leap year or
// not, starting on each weekday), so every month's shape.
func (c *calendar) rulesCanFire() bool {
	for y := 2000; y < 2028; y++ {
		for m := 1; m <= 12; m++ {
			if c.month&(1<<uint(m)) == 0 {
				continue
			}
			for d := 1; d <= daysIn(y, m); d++ {
				if c.dayMatches(daysFromCivil(y, m, d), y, m, d) {
					return true
				}
			}
		}
	}
	return false
}
