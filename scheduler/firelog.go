package scheduler

import (
	"log/slog"
	"time"

	"github.com/beatd/beatd/broker"
)

// fireLog rate-limits the per-fire INFO lines: a line per fire is what an
// operator wants at a few fires a second, and 20k lines a second at 20k
// fires a second costs more CPU than the fires. Past the limit in a
// second, the rest are counted and summarised in one line.
type fireLog struct {
	on         bool      // the fires being recorded are logged at all
	window     time.Time // start of the current one-second window
	lines      int       // lines logged in it
	suppressed [4]int    // fires not logged in it, by broker.Result
	manual     int
}

// allow says whether this fire gets its own line, and counts it if not.
func (f *fireLog) allow(now time.Time, limit int, r broker.Result, manual bool) bool {
	if now.Sub(f.window) >= time.Second {
		f.window, f.lines = now, 0
	}
	if f.lines < limit {
		f.lines++
		return true
	}
	f.suppressed[r]++
	if manual {
		f.manual++
	}
	return false
}

// summarise logs the counts of the fires not logged, once their window
// has passed.
func (f *fireLog) summarise(log *slog.Logger, now time.Time, token int64) {
	if now.Sub(f.window) < time.Second {
		return
	}
	n := f.suppressed[broker.ResultOK] + f.suppressed[broker.ResultDuplicate]
	if n == 0 {
		return
	}
	log.Info("fired (summary of lines over the per-second limit)", "token", token, "fires", n,
		"ok", f.suppressed[broker.ResultOK], "duplicate", f.suppressed[broker.ResultDuplicate],
		"manual", f.manual, "since", f.window.UTC().Format(time.RFC3339Nano))
	f.suppressed, f.manual = [4]int{}, 0
}
