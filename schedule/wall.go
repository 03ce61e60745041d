package schedule

import (
	"math"
	"time"
)

// Wall-clock arithmetic on "local seconds": seconds since 1970-01-01T00:00
// on a zone's wall clock, as if that clock were UTC. Working on integers
// keeps Next free of allocations and of time.Date's unspecified choice in
// DST gaps and overlaps.

const secondsPerDay = 86400

// daysFromCivil returns the days since 1970-01-01 of a proleptic Gregorian
// date (Howard Hinnant's algorithm).
func daysFromCivil(y, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(int64(y), 400)
	yoe := int64(y) - era*400
	mp := int64((m + 9) % 12)
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// civilFromDays is the inverse of daysFromCivil.
func civilFromDays(z int64) (y, m, d int) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	if mp < 10 {
		m = int(mp + 3)
	} else {
		m = int(mp - 9)
	}
	y = int(yoe + era*400)
	if m <= 2 {
		y++
	}
	return y, m, d
}

// weekdayOf returns the weekday of a day count, Sunday = 0.
func weekdayOf(days int64) int {
	return int(floorMod(days+4, 7)) // 1970-01-01 was a Thursday.
}

func isLeap(y int) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

func daysIn(y, m int) int {
	switch m {
	case 2:
		if isLeap(y) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// zoneSpan caches one zone period of a location: within [start, end) the
// UTC offset is off. It lets Next resolve most wall times with arithmetic.
type zoneSpan struct {
	start, end int64 // unix seconds; math.MinInt64/MaxInt64 when unbounded
	off        int64
}

func spanAt(u int64, loc *time.Location) zoneSpan {
	if loc == time.UTC {
		return zoneSpan{start: math.MinInt64, end: math.MaxInt64}
	}
	t := time.Unix(u, 0).In(loc)
	_, off := t.Zone()
	start, end := t.ZoneBounds()
	s := zoneSpan{start: math.MinInt64, end: math.MaxInt64, off: int64(off)}
	if !start.IsZero() {
		s.start = start.Unix()
	}
	if !end.IsZero() {
		s.end = end.Unix()
	}
	return s
}

func offsetAt(u int64, loc *time.Location) int64 {
	if loc == time.UTC {
		return 0
	}
	_, off := time.Unix(u, 0).In(loc).Zone()
	return int64(off)
}

// resolve maps local seconds w on loc's wall clock to an instant, applying
// beatd's DST policy:
//   - a wall time that occurs twice (fall-back overlap) maps to its first
//     occurrence;
//   - a wall time that does not exist (spring-forward gap) maps to the first
//     instant after the gap, i.e. the transition itself.
//
// hint is a zone period near w; when w falls well inside it no lookup is
// needed. The policy assumes a zone does not change offset twice within two
// days, which holds for every zone in the tz database since 1970.
func resolve(w int64, loc *time.Location, hint zoneSpan) int64 {
	u := w - hint.off
	// Unambiguous when u is inside the hinted period and at least a day
	// away from its start: no earlier period can also claim w.
	if u < hint.end && (hint.start == math.MinInt64 || u-hint.start >= secondsPerDay) {
		return u
	}
	// The true instant is within ±14h of w read as UTC, so offsets a day
	// either side bracket any transition that matters.
	o1 := offsetAt(w-secondsPerDay, loc)
	o2 := offsetAt(w+secondsPerDay, loc)
	u1, u2 := w-o1, w-o2
	v1 := offsetAt(u1, loc) == o1
	v2 := offsetAt(u2, loc) == o2
	switch {
	case v1 && v2:
		return min(u1, u2)
	case v1:
		return u1
	case v2:
		return u2
	}
	// A gap: the transition is where the period holding the earlier
	// candidate ends.
	_, end := time.Unix(min(u1, u2), 0).In(loc).ZoneBounds()
	if end.IsZero() {
		return max(u1, u2)
	}
	return end.Unix()
}
