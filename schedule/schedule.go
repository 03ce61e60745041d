package schedule

import (
	"fmt"
	"math"
	"time"
)

// Schedule yields an entry's slots: the nominal times it fires.
type Schedule interface {
	// Next returns the first slot strictly after t, or the zero time when
	// there is none ("never").
	Next(t time.Time) time.Time
}

var (
	_ Schedule = (*Crontab)(nil)
	_ Schedule = (*Cron)(nil)
	_ Schedule = (*Every)(nil)
	_ Schedule = (*At)(nil)
)

// Every fires at Anchor + k·Interval for every integer k. Slots never drift
// with dispatch time, so every replica computes the same ones. Celery's
// interval schedule instead restarts from the send time, which drifts.
//
// A config entry without start_at and without relative leaves Anchor zero
// and the scheduler anchors it with AnchoredAt at the instant the entry was
// first scheduled (persisted in etcd), as Celery counts from an entry's
// first appearance. Relative entries keep the epoch grid, aligned to the
// clock.
type Every struct {
	Interval time.Duration
	Anchor   time.Time // zero means the Unix epoch
	Relative bool      // clock-aligned: never re-anchored
	anchored bool      // Anchor was set by AnchoredAt, not by start_at
}

// NewEvery returns an interval schedule; interval must be positive, and
// a non-zero anchor within the times UnixNano represents (1678 to 2262).
func NewEvery(interval time.Duration, anchor time.Time) (*Every, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("every: interval must be positive, got %s", interval)
	}
	if !anchor.IsZero() && !nanoTime(anchor) {
		return nil, fmt.Errorf("every: anchor %s is outside the times an interval can count from", anchor.Format(time.RFC3339))
	}
	return &Every{Interval: interval, Anchor: anchor}, nil
}

// minNano and maxNano bound the times whose UnixNano is defined.
var (
	minNano = time.Unix(0, math.MinInt64)
	maxNano = time.Unix(0, math.MaxInt64)
)

// nanoTime says whether t's UnixNano is defined.
func nanoTime(t time.Time) bool { return !t.Before(minNano) && !t.After(maxNano) }

func (e *Every) anchorNanos() int64 {
	if e.Anchor.IsZero() {
		return 0
	}
	return e.Anchor.UnixNano()
}

// Next returns the first slot strictly after t. Before the anchor the first
// slot is the anchor itself. A slot past what UnixNano represents (2262)
// is none: the zero time. The arithmetic cannot overflow, so a slot is
// always after t.
func (e *Every) Next(t time.Time) time.Time {
	a := e.anchorNanos()
	iv := int64(e.Interval)
	if iv <= 0 || t.After(maxNano) {
		return time.Time{}
	}
	if t.Before(minNano) || t.UnixNano() < a {
		return time.Unix(0, a).UTC()
	}
	// n ≥ a, so n-a fits in a uint64 even when a is negative; so does
	// the slot's offset from a, checked against what is left above a.
	since := uint64(t.UnixNano()) - uint64(a)
	off := since - since%uint64(iv) + uint64(iv)
	if off < since || off > uint64(math.MaxInt64)-uint64(a) {
		return time.Time{}
	}
	return time.Unix(0, int64(uint64(a)+off)).UTC()
}

// slotsIn counts the slots in (after, through] and returns the latest one.
func (e *Every) slotsIn(after, through time.Time) (count int64, last time.Time) {
	first := e.Next(after)
	if first.IsZero() || first.After(through) || !nanoTime(through) {
		return 0, time.Time{}
	}
	iv := int64(e.Interval)
	span := through.UnixNano() - first.UnixNano()
	count = span/iv + 1
	return count, time.Unix(0, first.UnixNano()+(count-1)*iv).UTC()
}

func (e *Every) String() string {
	if e.Relative {
		return "every " + e.Interval.String() + " (relative)"
	}
	if e.Anchor.IsZero() {
		return "every " + e.Interval.String()
	}
	return fmt.Sprintf("every %s from %s", e.Interval, e.Anchor.UTC().Format(time.RFC3339))
}

// At fires once.
type At struct {
	Time time.Time
}

// Next returns the one slot if it is after t, else the zero time.
func (a *At) Next(t time.Time) time.Time {
	if a.Time.After(t) {
		return a.Time
	}
	return time.Time{}
}

func (a *At) String() string { return "at " + a.Time.Format(time.RFC3339) }

// MaxScan bounds how many slots Missed walks one by one, so a rare spec or a
// long outage can never make it loop without end.
const MaxScan = 1_000_000

// MissedSlots is the answer to "which slots fell in (after, through]?".
type MissedSlots struct {
	// Slots holds the latest slots, at most the limit asked for, oldest
	// first.
	Slots []time.Time
	// Count is how many slots fell in the interval. When Capped is set the
	// walk stopped at MaxScan and Count is a lower bound.
	Count  int64
	Capped bool
}

// Missed lists the slots of s in (after, through], keeping the latest limit
// of them. The zero after means "never ran": nothing is missed then, since a
// new entry starts at its next slot. It is pure and bounded.
func Missed(s Schedule, after, through time.Time, limit int) MissedSlots {
	var out MissedSlots
	if after.IsZero() || !through.After(after) || limit < 0 {
		return out
	}
	if e, ok := s.(*Every); ok {
		count, last := e.slotsIn(after, through)
		out.Count = count
		keep := min(count, int64(limit))
		for i := keep - 1; i >= 0; i-- {
			out.Slots = append(out.Slots, last.Add(-time.Duration(i)*e.Interval))
		}
		return out
	}
	ring := make([]time.Time, 0, min(limit, 1024))
	head := 0
	for t := s.Next(after); !t.IsZero() && !t.After(through); t = s.Next(t) {
		out.Count++
		if limit > 0 {
			if len(ring) < limit {
				ring = append(ring, t)
			} else {
				ring[head] = t
				head = (head + 1) % limit
			}
		}
		if out.Count >= MaxScan {
			out.Capped = true
			break
		}
	}
	out.Slots = append(ring[head:len(ring):len(ring)], ring[:head]...)
	return out
}

// TimeLayout is how beatd prints a slot: RFC 3339 with the zone's numeric
// offset, "+00:00" rather than "Z", as Python's isoformat() writes it.
const TimeLayout = "2006-01-02T15:04:05-07:00"

// FormatSlot prints a slot in its zone like Python's isoformat(): seconds,
// then microseconds only when there are any, then the numeric offset.
func FormatSlot(t time.Time) string {
	if t.Nanosecond() == 0 {
		return t.Format(TimeLayout)
	}
	return t.Format("2006-01-02T15:04:05.000000-07:00")
}

// NotBefore drops the slots of a schedule that fall before Start.
type NotBefore struct {
	Schedule
	Start time.Time
}

// Next returns the first slot strictly after t and not before Start.
func (nb *NotBefore) Next(t time.Time) time.Time {
	if floor := nb.Start.Add(-time.Nanosecond); t.Before(floor) {
		t = floor
	}
	return nb.Schedule.Next(t)
}

func (nb *NotBefore) String() string {
	return fmt.Sprintf("%v from %s", nb.Schedule, nb.Start.Format(time.RFC3339))
}

// Until drops the slots of a schedule that fall after End (end_at).
type Until struct {
	Schedule
	End time.Time
}

// Next returns the first slot strictly after t, or zero past End.
func (u *Until) Next(t time.Time) time.Time {
	n := u.Schedule.Next(t)
	if n.IsZero() || n.After(u.End) {
		return time.Time{}
	}
	return n
}

func (u *Until) String() string {
	return fmt.Sprintf("%v until %s", u.Schedule, u.End.Format(time.RFC3339))
}

// Never has no slot: an entry that has run its max_runs.
type Never struct{}

// Next returns the zero time.
func (Never) Next(time.Time) time.Time { return time.Time{} }

func (Never) String() string { return "never" }

// Base strips the wrappers that only drop slots (Until, Except), for
// callers that need the grid itself.
func Base(s Schedule) Schedule {
	for {
		switch w := s.(type) {
		case *Until:
			s = w.Schedule
		case *Except:
			s = w.Schedule
		default:
			return s
		}
	}
}

// Except drops the slots Excluded says no to (an entry's exclusion
// calendars). A schedule whose every slot is excluded for
// maxExcludedRun slots in a row is taken to have none left.
type Except struct {
	Schedule
	Excluded func(time.Time) bool
}

// maxExcludedRun bounds the slots Except skips in a row: ten years of
// daily slots, so a calendar that excludes everything ends the entry
// rather than the loop.
const maxExcludedRun = 3660

// Next returns the first slot strictly after t that is not excluded.
func (x *Except) Next(t time.Time) time.Time {
	for range maxExcludedRun {
		t = x.Schedule.Next(t)
		if t.IsZero() || !x.Excluded(t) {
			return t
		}
	}
	return time.Time{}
}
