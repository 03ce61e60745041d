package config

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// The bounds every entry is held to, wherever it comes from (the file,
// the entries API, django-celery-beat, import): one entry outside them
// could otherwise stall the loop or overflow its arithmetic, and with it
// every other entry. docs/schedules.md ("Limits") lists them.
const (
	// DefaultMinInterval is the shortest every: accepted unless the
	// command line says otherwise (Options.MinInterval).
	DefaultMinInterval = 100 * time.Millisecond
	// MinIntervalLowest and MinIntervalHighest bound --min-interval. 1 ms
	// is a thousand publishes a second from one entry, about what one
	// leader sustains for its whole schedule. 1 s is the finest spacing of
	// cron (with seconds) and crontab, so the floor only ever bears on
	// every:.
	MinIntervalLowest  = time.Millisecond
	MinIntervalHighest = time.Second
	// MaxInterval is the longest every:, and MaxDuration the longest of
	// every other span (catchup_window, jitter, overlap_timeout,
	// options.expires, options.time_limit): ten years. A span is added
	// to times up to latestTime, and the sum must stay below 2262-04-11,
	// where time.Duration and UnixNano arithmetic overflow.
	MaxInterval = 3660 * 24 * time.Hour
	MaxDuration = MaxInterval
	// MaxNameLength is the longest entry name, in characters: that of
	// django-celery-beat's PeriodicTask.name, so every name it holds fits.
	MaxNameLength = 200
	// MaxValueBytes bounds an entry's args, kwargs and headers together,
	// measured as the JSON of the message that carries them: a Celery
	// message is not a file transfer, and a million entries of it must
	// fit in memory and in etcd (whose requests stop at about 1.5 MiB).
	MaxValueBytes = 256 << 10
)

// earliestTime and latestTime bound every time an entry names (start_at,
// end_at, at, options.expires): from the Unix epoch, the origin of the
// interval grid, to 2200, which leaves MaxDuration of room below
// 2262-04-11, where UnixNano overflows.
var (
	earliestTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	latestTime   = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Options are the validation settings that come from the command line
// rather than from the file; the zero Options are the defaults.
type Options struct {
	// MinInterval is the shortest every: accepted (0: DefaultMinInterval).
	// It must pass CheckMinInterval.
	MinInterval time.Duration
}

// CheckMinInterval reports whether d is a usable --min-interval (0 means
// the default).
func CheckMinInterval(d time.Duration) error {
	if d != 0 && (d < MinIntervalLowest || d > MinIntervalHighest) {
		return fmt.Errorf("config: the minimum interval must be between %s and %s, got %s", MinIntervalLowest, MinIntervalHighest, d)
	}
	return nil
}

func (o Options) minInterval() time.Duration {
	if o.MinInterval == 0 {
		return DefaultMinInterval
	}
	return o.MinInterval
}

// checkTime returns t when it is in [earliestTime, latestTime), else
// reports it and returns the zero time.
func (d *decoder) checkTime(n *yaml.Node, what string, t time.Time) (time.Time, bool) {
	if t.Before(earliestTime) || !t.Before(latestTime) {
		d.errorf(n, "%s %s is outside the times beatd schedules (from %s, before %s)", what, t.Format(time.RFC3339),
			earliestTime.Format("2006-01-02"), latestTime.Format("2006-01-02"))
		return time.Time{}, false
	}
	return t, true
}

// shortName is name for an error message: whole unless it is long.
func shortName(name string) string {
	const keep = 40
	if len(name) <= keep+3 {
		return name
	}
	cut := keep
	for cut > 0 && name[cut]&0xc0 == 0x80 { // not inside a UTF-8 sequence
		cut--
	}
	return name[:cut] + "..."
}

// MinIntervalUsage is the help of --min-interval, on run and validate.
const MinIntervalUsage = "the shortest every: an entry may have, in schedules.yaml and runtime entries alike (1ms to 1s); " +
	"below the default, each such entry takes more of the loop that publishes every entry"
