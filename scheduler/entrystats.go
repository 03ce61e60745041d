package scheduler

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beatd/beatd/internal/unixns"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/store"

	"github.com/prometheus/client_golang/prometheus"
)

// entryStats is what the leader's loop last did with each entry: its next
// due slot, its oldest slot queued but not yet published, its last
// successful publish and its last result. The loop writes it; /metrics
// and /status read it. It lives only in memory, on the leader: nothing
// here is written to etcd.
//
// Past the per-entry limit it keeps records only for entries whose last
// publish failed (for their last error), and the aggregates come from the
// loop itself: its heap's next due time and its oldest pending slot.
type entryStats struct {
	perEntry atomic.Bool
	// The loop's next due slot and oldest pending slot (Unix ns, 0: none).
	heapDue, pendingDue atomic.Int64
	reported            atomic.Bool // the loop has reported this term
	mu                  sync.Mutex
	leading             bool
	byName              map[string]*entryStat
	// flags are the entries the loop flagged behind or runaway
	// (entryhealth.go): few, and kept past the per-entry limit too.
	flags map[string]entryFlag
}

// entryStat is one entry's record, compact (times in Unix nanoseconds, 0
// for none): there is one per entry, 100k of them in a large config.
type entryStat struct {
	nextDue     int64 // next scheduled due time
	oldestQueue int64 // due time of the oldest slot queued, not yet published
	lastSuccess int64
	lastErrorAt int64
	lastError   string
	lastResult  uint8 // index in fireResults, +1; 0 for none
	// What the workers reported (outcomes tracked): the last success and
	// failure, the failure streak and the last runtime.
	workerSuccess, workerFailure int64
	failures                     int32
	runtime                      time.Duration
	period                       time.Duration // between its next two slots, for "not succeeded in N periods"
}

// EntryResult is an entry's last outcome on this replica's current or
// last term, for /status.
type EntryResult struct {
	// Health is HealthBehind or HealthRunaway while the loop flags the
	// entry (empty: it keeps its schedule), HealthReason says why.
	Health, HealthReason string
	LastResult           string
	LastError            string
	LastErrorAt          time.Time
	LastSuccessAt        time.Time
	NextFireAt           time.Time // the oldest slot not yet published, else the next one
}

func newEntryStats() *entryStats { return &entryStats{byName: map[string]*entryStat{}} }

// stat returns name's record; the caller holds mu.
func (s *entryStats) stat(name string) *entryStat {
	st := s.byName[name]
	if st == nil {
		st = &entryStat{}
		s.byName[name] = st
	}
	return st
}

// retain drops the records of entries no longer configured and, with
// create, makes one for every entry (their series then start at 0).
func (s *entryStats) retain(names []string, create bool) {
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if create {
		for _, n := range names {
			s.stat(n)
		}
	}
	for n := range s.byName {
		if !keep[n] {
			delete(s.byName, n)
		}
	}
}

// termStarted and the func it returns bracket a term: the due times are
// only meaningful while this replica's loop runs. Until the loop first
// reports (it may be stuck raising the fence while the broker is down),
// the next fire is the earliest slot after the election, computed in the
// background (100k entries take a few hundred ms, not to be added to a
// failover): one that passes unpublished is overdue, as it should be.
func (m *Metrics) termStarted(ctx context.Context, set *entrySet, term Term, now time.Time) (ended func()) {
	s := m.stats
	s.mu.Lock()
	s.leading = true
	s.reported.Store(false)
	s.heapDue.Store(0)
	s.pendingDue.Store(0)
	for _, st := range s.byName {
		st.nextDue, st.oldestQueue = 0, 0
	}
	s.mu.Unlock()
	from := now
	if !term.Elected.IsZero() && term.Elected.Before(now) {
		from = term.Elected
	}
	// The definitions as the term starts, which no one changes: the
	// loop's entries are its own while this goroutine runs.
	defs := set.config.Entries
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		earliest, i := int64(0), 0
		for _, e := range defs {
			if i++; i%1024 == 0 && (ctx.Err() != nil || s.reported.Load()) {
				return
			}
			if !e.Enabled {
				continue
			}
			if t := e.Schedule.Next(from); !t.IsZero() && (earliest == 0 || t.UnixNano() < earliest) {
				earliest = t.UnixNano()
			}
		}
		if !s.reported.Load() {
			s.heapDue.CompareAndSwap(0, earliest)
		}
	}()
	return func() {
		cancel()
		<-done
		m.termEnded()
	}
}

func (m *Metrics) termEnded() {
	s := m.stats
	s.mu.Lock()
	s.leading = false
	clear(s.flags) // the next term's loop finds its own
	s.mu.Unlock()
	s.heapDue.Store(0)
	s.pendingDue.Store(0)
	m.PendingSlots.Set(0)
}

// reportDue publishes the loop's pending count and its earliest due
// times, each time round the loop.
func (l *loop) reportDue() {
	s := l.s.cfg.Metrics.stats
	l.s.cfg.Metrics.PendingSlots.Set(float64(len(l.pending)))
	var heapDue, pendingDue int64
	if len(l.heap) > 0 {
		heapDue = l.heap[0].due
	}
	// Catch-up and collected slots queue in due order, and failed ones
	// go back in front: the head is the oldest.
	if len(l.pending) > 0 && !l.pending[0].manual {
		pendingDue = l.pending[0].due.UnixNano()
	}
	s.heapDue.Store(heapDue)
	s.pendingDue.Store(pendingDue)
	s.reported.Store(true)
}

// scheduled records name's next due time (zero: no further slot).
func (m *Metrics) scheduled(name string, due time.Time) {
	s := m.stats
	if !s.perEntry.Load() {
		return
	}
	s.mu.Lock()
	s.stat(name).nextDue = unixns.From(due)
	s.mu.Unlock()
}

// queued records that a slot of name due at due waits to be published.
func (m *Metrics) queued(name string, due time.Time) {
	s := m.stats
	if !s.perEntry.Load() {
		return
	}
	s.mu.Lock()
	if st := s.stat(name); st.oldestQueue == 0 || due.UnixNano() < st.oldestQueue {
		st.oldestQueue = due.UnixNano()
	}
	s.mu.Unlock()
}

// published records a publish outcome of name at now.
func (m *Metrics) published(name, result string, manual bool, now time.Time, err error) {
	s := m.stats
	s.mu.Lock()
	if !s.perEntry.Load() && result != "error" {
		// Past the limit only failing entries keep a record.
		delete(s.byName, name)
		s.mu.Unlock()
		return
	}
	st := s.stat(name)
	for i, r := range fireResults {
		if r == result {
			st.lastResult = uint8(i + 1)
		}
	}
	switch result {
	case "ok", "duplicate", ResultManual:
		st.lastSuccess = now.UnixNano()
		if !manual {
			st.oldestQueue = 0
		}
	case "error":
		if err != nil {
			st.lastError, st.lastErrorAt = err.Error(), now.UnixNano()
		}
	}
	s.mu.Unlock()
}

// setPeriod records the gap between name's next two slots.
func (m *Metrics) setPeriod(name string, d time.Duration) {
	s := m.stats
	if !s.perEntry.Load() || d <= 0 {
		return
	}
	s.mu.Lock()
	s.stat(name).period = d
	s.mu.Unlock()
}

// outcome records what the workers reported about name's run.
func (m *Metrics) outcome(name string, o *store.Outcomes, run *outcome.Run) {
	s := m.stats
	if !s.perEntry.Load() {
		return
	}
	s.mu.Lock()
	st := s.stat(name)
	st.workerSuccess, st.workerFailure, st.failures = unixns.From(o.LastSuccess), unixns.From(o.LastFailure), int32(o.Failures)
	if run.Runtime > 0 {
		st.runtime = run.Runtime
	}
	s.mu.Unlock()
}

// Results returns each entry's last outcome, by name.
func (m *Metrics) Results() map[string]EntryResult {
	s := m.stats
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]EntryResult, len(s.byName))
	for n, st := range s.byName {
		r := EntryResult{LastError: st.lastError, LastErrorAt: unixns.Time(st.lastErrorAt), LastSuccessAt: unixns.Time(st.lastSuccess)}
		if st.lastResult > 0 {
			r.LastResult = fireResults[st.lastResult-1]
		}
		if s.leading {
			r.NextFireAt = unixns.Time(st.next())
		}
		out[n] = r
	}
	for n, f := range s.flags {
		r := out[n]
		r.Health, r.HealthReason = f.kind, f.reason
		out[n] = r
	}
	return out
}

// next is the entry's next fire for alerting: a queued slot still
// unpublished, else the next scheduled one.
func (st *entryStat) next() int64 {
	if st.oldestQueue != 0 {
		return st.oldestQueue
	}
	return st.nextDue
}

var (
	descNextFire = prometheus.NewDesc("beatd_entry_next_fire_timestamp_seconds",
		"When the entry fires next: the due time of its oldest slot not yet published, else of its next slot. In the past means overdue. Leader only; only up to the per-entry limit.",
		[]string{"entry"}, nil)
	descLastSuccess = prometheus.NewDesc("beatd_entry_last_success_timestamp_seconds",
		"When the entry was last published (ok, duplicate or manual) by this replica; 0 if never. Only up to the per-entry limit.",
		[]string{"entry"}, nil)
	descWorkerSuccess = prometheus.NewDesc("beatd_entry_last_worker_success_timestamp_seconds",
		"When a worker last reported a run of the entry succeeded (task events or the result backend); 0 if none since this replica led. Only up to the per-entry limit.",
		[]string{"entry"}, nil)
	descWorkerFailure = prometheus.NewDesc("beatd_entry_last_worker_failure_timestamp_seconds",
		"When a run of the entry last failed on a worker, or was lost; 0 if none since this replica led. Only up to the per-entry limit.",
		[]string{"entry"}, nil)
	descFailures = prometheus.NewDesc("beatd_entry_consecutive_failures",
		"Runs of the entry that failed (or were lost) in a row, as last reported. Only up to the per-entry limit.",
		[]string{"entry"}, nil)
	descRuntime = prometheus.NewDesc("beatd_entry_last_runtime_seconds",
		"The runtime a worker reported for the entry's last successful run. Only up to the per-entry limit.",
		[]string{"entry"}, nil)
	descPeriod = prometheus.NewDesc("beatd_entry_period_seconds",
		"The gap between the entry's next two slots: alerts compare the age of its last success with it. Leader only; only up to the per-entry limit.",
		[]string{"entry"}, nil)
	descOldestNext = prometheus.NewDesc("beatd_oldest_next_fire_timestamp_seconds",
		"The earliest beatd_entry_next_fire_timestamp_seconds over all entries, at any number of entries: time() minus it is how overdue the most overdue entry is. Leader only.",
		nil, nil)
	descPerEntry = prometheus.NewDesc("beatd_per_entry_metrics",
		"1 if per-entry series are exported (entries at most --metrics-per-entry-limit), 0 if only aggregates are.", nil, nil)
)

// statsCollector exports entryStats at scrape time: with 100k entries,
// computing series then is cheaper than keeping 100k gauges current.
type statsCollector struct{ m *Metrics }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descNextFire
	ch <- descLastSuccess
	ch <- descWorkerSuccess
	ch <- descWorkerFailure
	ch <- descFailures
	ch <- descRuntime
	ch <- descPeriod
	ch <- descOldestNext
	ch <- descPerEntry
	ch <- descBehind
	ch <- descRunaway
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.stats
	perEntry := s.perEntry.Load()
	ch <- prometheus.MustNewConstMetric(descPerEntry, prometheus.GaugeValue, b2f(perEntry))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.collectFlags(ch)
	oldest := int64(0)
	for _, due := range []int64{s.heapDue.Load(), s.pendingDue.Load()} {
		if s.leading && due != 0 && (oldest == 0 || due < oldest) {
			oldest = due
		}
	}
	for name, st := range s.byName {
		if !perEntry {
			break
		}
		next := st.next()
		ch <- prometheus.MustNewConstMetric(descLastSuccess, prometheus.GaugeValue, unixSeconds(st.lastSuccess), name)
		if s.leading {
			ch <- prometheus.MustNewConstMetric(descWorkerSuccess, prometheus.GaugeValue, unixSeconds(st.workerSuccess), name)
			ch <- prometheus.MustNewConstMetric(descWorkerFailure, prometheus.GaugeValue, unixSeconds(st.workerFailure), name)
			ch <- prometheus.MustNewConstMetric(descFailures, prometheus.GaugeValue, float64(st.failures), name)
			if st.runtime > 0 {
				ch <- prometheus.MustNewConstMetric(descRuntime, prometheus.GaugeValue, st.runtime.Seconds(), name)
			}
			if st.period > 0 {
				ch <- prometheus.MustNewConstMetric(descPeriod, prometheus.GaugeValue, st.period.Seconds(), name)
			}
		}
		if s.leading && next != 0 {
			ch <- prometheus.MustNewConstMetric(descNextFire, prometheus.GaugeValue, unixSeconds(next), name)
		}
	}
	if oldest != 0 {
		ch <- prometheus.MustNewConstMetric(descOldestNext, prometheus.GaugeValue, unixSeconds(oldest))
	}
}

// unixSeconds turns Unix nanoseconds (0: never) into seconds, to the ms.
func unixSeconds(n int64) float64 {
	return math.Round(float64(n)/1e6) / 1e3
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
