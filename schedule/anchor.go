package schedule

import (
	"errors"
	"fmt"
	"math"
	"regexp"
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
	if e.Relative || (!e.Anchor.IsZero() && !e.anchored) || since.IsZero() || !nanoTime(since) {
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
	iv := int64(e.Interval)
	if iv <= 0 || t.Before(minNano) || t.UnixNano() <= a {
		return time.Unix(0, a).UTC()
	}
	if t.After(maxNano) {
		t = maxNano
	}
	since := uint64(t.UnixNano()) - uint64(a) // n > a: no overflow, as in Next
	return time.Unix(0, int64(uint64(a)+since-since%uint64(iv))).UTC()
}

// Anchor anchors s at since when s is an interval schedule that takes an
// anchor (see Every.AnchoredAt); every other schedule is returned as is.
func Anchor(s Schedule, since time.Time) Schedule {
	if e, ok := s.(*Every); ok {
		return e.AnchoredAt(since)
	}
	return s
}

// ErrDurationRange is ParseDuration's error for a duration beyond what
// time.Duration holds (about 292 years).
var ErrDurationRange = errors.New("schedule: duration out of range")

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
		part := n * float64(unit)
		if part >= float64(math.MaxInt64-total) {
			return 0, fmt.Errorf("%w: %q", ErrDurationRange, orig)
		}
		total += time.Duration(part)
		s = s[i+1:]
	}
	if s != "" {
		rest, err := time.ParseDuration(s)
		if err != nil {
			if goDurationSyntax.MatchString(s) {
				// Well formed, so time.ParseDuration refused it as too long.
				return 0, fmt.Errorf("%w: %q", ErrDurationRange, orig)
			}
			return 0, fmt.Errorf("time: invalid duration %q", orig)
		}
		if rest < 0 {
			return 0, fmt.Errorf("time: invalid duration %q", orig)
		}
		if rest > math.MaxInt64-total {
			return 0, fmt.Errorf("%w: %q", ErrDurationRange, orig)
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

// goDurationSyntax is what time.ParseDuration reads (unsigned).
var goDurationSyntax = regexp.MustCompile(`^(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)
