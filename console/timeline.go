package console

import (
	"maps"
	"math"
	"sync"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/internal/unixns"
	"github.com/jonboulle/clockwork"
)

// Timeline is the leader's in-memory record of its current term's fires:
// per minute over the last hour (fires, errors, lag p99) and per entry
// (fires in the last hour, last result, last slot). It is fed by the
// scheduler's Observer and starts over with each term, so what it shows is
// what this replica published as leader.
type Timeline struct {
	now func() time.Time

	mu      sync.Mutex
	term    int64
	since   time.Time
	minutes [60]minuteStats
	entries map[string]*entryStats
	swept   int64 // the minute of the last sweep
	peak    int   // the most records since the map was last copied
}

// lag histogram: bucket i holds lags up to lagBase·lagGrowth^i, so the p99
// read from it is within 25% above the true value.
const (
	lagBuckets = 80
	lagBase    = 100 * time.Microsecond
	lagGrowth  = 1.25
)

type minuteStats struct {
	minute int64 // Unix minute this bucket holds; others are stale
	fires  uint32
	errors uint32
	lag    [lagBuckets]uint32
}

// entryStats is one entry's record, kept small: a leader at a million
// entries holds one for each entry that fired in the last hour. Times are
// Unix nanoseconds (0: none), minutes are Unix minutes.
type entryStats struct {
	at       int64 // when the last fire was observed
	lastSlot int64 // newest scheduled slot published (ok or duplicate)
	// The fires of the last hour: the minutes of the last few, until an
	// entry fires more often than that in an hour; then a count per
	// minute. Most entries at scale fire a few times an hour, and the
	// 120 bytes of counts would be most of the record.
	counts *[60]uint16
	recent [recentFires]int32
	nrec   uint8
	result broker.Result
	manual bool
	last   int32 // minute of the newest fire or error
}

// recentFires is how many fires an hour an entry's record holds before
// it counts them per minute.
const recentFires = 4

// sweepEvery is how many minutes apart Observe drops the records of
// entries that have not fired for an hour: their persisted state says
// what the record did, and churn (tenants come and go) must not grow it.
// A sweep walks every record under the lock, on the scheduler's loop: at
// a million entries tens of milliseconds. So it waits for the second half
// of a minute, away from the crontab slots that fall due together at its
// start, unless no fire comes then for another sweepEvery.
const sweepEvery = 10

// NewTimeline returns an empty timeline reading the time from now (nil:
// the real clock's); the daemon passes its clock's.
func NewTimeline(now func() time.Time) *Timeline {
	if now == nil {
		now = clockwork.NewRealClock().Now
	}
	return &Timeline{now: now, entries: map[string]*entryStats{}}
}

// Observe records one fire of term. A fire of a newer term starts the
// timeline over.
func (t *Timeline) Observe(term int64, entry string, slot time.Time, r broker.Result, lag time.Duration, manual bool) {
	now := t.now()
	min := now.Unix() / 60
	t.mu.Lock()
	defer t.mu.Unlock()
	if term != t.term {
		t.term, t.since = term, now
		t.minutes = [60]minuteStats{}
		t.entries = map[string]*entryStats{}
	}
	b := &t.minutes[min%60]
	if b.minute != min {
		*b = minuteStats{minute: min}
	}
	ok := r == broker.ResultOK || r == broker.ResultDuplicate
	if ok {
		b.fires++
		if !manual {
			b.lag[lagBucket(lag)]++
		}
	} else {
		b.errors++
	}
	e := t.entries[entry]
	if e == nil {
		e = &entryStats{last: int32(min)}
		t.entries[entry] = e
	}
	if e.counts != nil {
		e.roll(int32(min))
	}
	e.last = max(e.last, int32(min))
	if ok {
		e.count(int32(min))
		if ns := unixns.From(slot); !manual && ns > e.lastSlot {
			e.lastSlot = ns
		}
	}
	e.result, e.manual, e.at = r, manual, now.UnixNano()
	if due := min - t.swept; due >= 2*sweepEvery || due >= sweepEvery && now.Second() >= 30 {
		t.sweep(int32(min))
	}
}

// count adds a fire in minute min.
func (e *entryStats) count(min int32) {
	if e.counts == nil {
		if i := e.slotFor(min); i >= 0 {
			e.recent[i] = min
			return
		}
		// A fifth fire within the hour: count per minute from here.
		// The newest observation (last) is this minute, and every
		// fire in recent is of the hour up to it.
		e.counts = new([60]uint16)
		for _, m := range e.recent[:e.nrec] {
			e.counts[m%60]++
		}
	}
	e.counts[min%60]++
}

// slotFor is where in recent a fire of minute min goes (a free slot or
// one older than an hour), or -1 when all hold fires of the last hour.
func (e *entryStats) slotFor(min int32) int {
	if int(e.nrec) < len(e.recent) {
		e.nrec++
		return int(e.nrec) - 1
	}
	for i, m := range e.recent {
		if m <= min-60 {
			return i
		}
	}
	return -1
}

// roll zeroes the buckets of the minutes since the last count.
func (e *entryStats) roll(min int32) {
	if min-e.last >= 60 {
		*e.counts = [60]uint16{}
	} else {
		for m := e.last + 1; m <= min; m++ {
			e.counts[m%60] = 0
		}
	}
	e.last = max(e.last, min)
}

// hour is the fires in the hour up to minute min.
func (e *entryStats) hour(min int32) int {
	n := 0
	if e.counts == nil {
		for _, m := range e.recent[:e.nrec] {
			if m > min-60 && m <= min {
				n++
			}
		}
		return n
	}
	for m := min - 59; m <= min; m++ {
		if m > e.last-60 && m <= e.last {
			n += int(e.counts[m%60])
		}
	}
	return n
}

// sweep drops the entries that have not fired in the hour up to min; the
// caller holds mu. A map does not shrink, so one that lost most of its
// records is copied.
func (t *Timeline) sweep(min int32) {
	t.swept = int64(min)
	kept := 0
	for name, e := range t.entries {
		if e.last <= min-60 {
			delete(t.entries, name)
		} else {
			kept++
		}
	}
	if kept < t.peak/2 {
		fresh := make(map[string]*entryStats, kept)
		maps.Copy(fresh, t.entries)
		t.entries, t.peak = fresh, kept
	}
	t.peak = max(t.peak, kept)
}

func lagBucket(lag time.Duration) int {
	if lag <= lagBase {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(lag)/float64(lagBase)) / math.Log(lagGrowth)))
	return min(i, lagBuckets-1)
}

func lagBound(i int) time.Duration {
	return time.Duration(float64(lagBase) * math.Pow(lagGrowth, float64(i)))
}

// Minute is one minute of the timeline.
type Minute struct {
	Start  time.Time     `json:"start"`
	Fires  int           `json:"fires"`
	Errors int           `json:"errors"`
	LagP99 time.Duration `json:"lag_p99_ns"` // 0 when no scheduled fire
}

// EntryFires is what the timeline knows of one entry.
type EntryFires struct {
	LastHour int       `json:"last_hour"`
	Result   string    `json:"result"`
	Manual   bool      `json:"manual"`
	At       time.Time `json:"at"`
}

// Snapshot is the timeline as of now: the 60 minutes up to now, oldest
// first, and the entries asked for.
type Snapshot struct {
	Term    int64                 `json:"term"`
	Since   time.Time             `json:"since"`
	Minutes []Minute              `json:"minutes"`
	Entries map[string]EntryFires `json:"entries"`
}

// Snapshot returns the last hour and the stats of the named entries.
func (t *Timeline) Snapshot(names []string) Snapshot {
	now := t.now()
	cur := now.Unix() / 60
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{Term: t.term, Since: t.since, Minutes: make([]Minute, 0, 60), Entries: map[string]EntryFires{}}
	for m := cur - 59; m <= cur; m++ {
		out := Minute{Start: time.Unix(m*60, 0).UTC()}
		if b := &t.minutes[m%60]; b.minute == m {
			out.Fires, out.Errors = int(b.fires), int(b.errors)
			out.LagP99 = p99(&b.lag)
		}
		s.Minutes = append(s.Minutes, out)
	}
	for _, n := range names {
		if e := t.entries[n]; e != nil {
			s.Entries[n] = EntryFires{LastHour: e.hour(int32(cur)), Result: e.result.String(), Manual: e.manual, At: unixns.Time(e.at)}
		}
	}
	return s
}

func p99(h *[lagBuckets]uint32) time.Duration {
	var total uint64
	for _, c := range h {
		total += uint64(c)
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(float64(total) * 0.99))
	var seen uint64
	for i, c := range h {
		seen += uint64(c)
		if seen >= rank {
			return lagBound(i)
		}
	}
	return lagBound(lagBuckets - 1)
}

// Backlog counts the entries whose newest published slot is newer than
// persisted(name) says: published, but not yet written to etcd.
func (t *Timeline) Backlog(term int64, persisted func(name string) time.Time) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if term == 0 || term != t.term {
		return 0, term != 0 // a leader that has not fired yet has nothing pending
	}
	n := 0
	for name, e := range t.entries {
		if e.lastSlot != 0 && e.lastSlot > unixns.From(persisted(name)) {
			n++
		}
	}
	return n, true
}
