// Package unixns holds a time as Unix nanoseconds, with 0 for the zero
// time: records kept by the million (per-entry stats, the console's
// timeline) store their times in 8 bytes instead of a time.Time's 24.
package unixns

import "time"

// From is t in Unix nanoseconds, 0 for the zero time (whose UnixNano is
// out of range).
func From(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Time is the time of n, the zero time for 0.
func Time(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
