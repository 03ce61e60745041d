package schedule

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// AnchoredAt returns the schedule with its grid anchored at since,
// truncated to the second, when it has no anchor of its own: start_at wins,
// a relative schedule keeps the clock-aligned epoch grid, and a zero since
// changes nothing. An anchor set by an earlier AnchoredAt is replaced. It
// is pure; e is not modified.
func (e *Every) AnchoredAt(since time.Time) *Every {
	if e.Relative || (!e.Anchor.IsZero() && !e.anchored) || since.IsZero() {
		return e
	}
	c := *e
	c.Anchor = since.Truncate(time.Second).UTC()
	c.anchored = true
	return &c
}

// Prev returns the latest slot at or before t (the anchor when t is before
// it).
func (e *Every) Prev(t time.Time) time.Time {
	a := e.anchorNanos()
	n := t.UnixNano()
	if n <= a {
		return time.Unix(0, a).UTC()
	}
	iv := int64(e.Interval)
	return time.Unix(0, a+(n-a)/iv*iv).UTC()
}

// Anchor anchors s at since when s is an interval schedule that takes an
// anchor (see Every.AnchoredAt); every other schedule is returned as is.
func Anchor(s Schedule, since time.Time) Schedule {
	if e, ok := s.(*Every); ok {
		return e.AnchoredAt(since)
	}
	return s
}

// ParseDuration is time.ParseDuration plus the units Celery users write as
// timedelta(days=1) and timedelta(weeks=1): "1d", "2w", "1w2d12h", "1.5d".
// Days and weeks are fixed 24 h and 168 h spans, as timedelta's are.
func ParseDuration(s string) (time.Duration, error) {
	orig := s
	var total time.Duration
	neg := false
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		neg, s = true, rest
	} else {
		s = strings.TrimPrefix(s, "+")
	}
	// Leading day and week components; the rest is Go's syntax.
	for s != "" {
		i := 0
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
			i++
		}
		if i == 0 || i == len(s) || (s[i] != 'd' && s[i] != 'w') {
			break
		}
		n, err := strconv.ParseFloat(s[:i], 64)
		if err != nil {
			return 0, fmt.Errorf("time: invalid duration %q", orig)
		}
		unit := 24 * time.Hour
		if s[i] == 'w' {
			unit = 7 * 24 * time.Hour
		}
		if n*float64(unit) > float64(1<<62) {
			return 0, fmt.Errorf("time: invalid duration %q: too long", orig)
		}
		total += time.Duration(n * float64(unit))
		s = s[i+1:]
	}
	if s != "" {
		rest, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("time: invalid duration %q", orig)
		}
		if rest < 0 {
			return 0, fmt.Errorf("time: invalid duration %q", orig)
		}
		total += rest
	} else if total == 0 && !strings.ContainsAny(orig, "dw") {
		return 0, fmt.Errorf("time: invalid duration %q", orig)
	}
	if neg {
		total = -total
	}
	return total, nil
}
