package scheduler

import (
	"sync/atomic"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/outcome"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the scheduler's Prometheus metrics: firing, the running
// config's entries and the state backlog. Leadership and reload metrics
// belong to the packages that change them.
type Metrics struct {
	Fires   *EntryCounterVec // entry, result
	FireLag prometheus.Histogram
	Missed  *EntryCounterVec // entry, reason
	Entries prometheus.Gauge
	// EtcdErrors and RedisErrors count failed client operations. The loop
	// makes most of them; the daemon's probes and the leadership loop add
	// theirs, since each name is one series per process.
	EtcdErrors  prometheus.Counter
	RedisErrors prometheus.Counter
	// StatePersistFailing is 1 while the leader's state writes fail.
	StatePersistFailing prometheus.Gauge
	// StateUnpersistedAge is the age of the oldest state change not yet
	// written to etcd.
	StateUnpersistedAge prometheus.Gauge
	PendingSlots        prometheus.Gauge
	// Runs counts runs by what they reached on the workers (published,
	// succeeded, failed, lost, skipped...); RunDuration is the workers'
	// reported runtime; AutoPaused counts pause_after_failures pauses.
	Runs        *EntryCounterVec // entry, outcome
	RunDuration prometheus.Histogram
	AutoPaused  prometheus.Counter
	// Deduplicated counts slots the broker refused as already pushed by
	// an earlier term: published once, and counted as ok in Fires.
	// PublishRetries counts failed publishes of slots that had failed
	// before: Fires counts each slot once.
	Deduplicated   prometheus.Counter
	PublishRetries prometheus.Counter

	// PerEntryLimit: with more entries than this, the entry label is
	// left empty and per-entry gauges are not exported, so 100k entries do
	// not make 1M series. Aggregates are always exported.
	PerEntryLimit int

	stats *entryStats
	// mode counts the switches between per-entry and aggregate series.
	// Each drops the series the entries' cached counters point at.
	mode atomic.Uint32
}

// DefaultPerEntryLimit is PerEntryLimit unless set.
const DefaultPerEntryLimit = 1000

// Fire results counted in beatd_fires_total, shown in /status and the
// console: broker.Result's words (its String is their one home), plus
// ResultManual for a trigger published and ResultBackfill.
var fireResults = []string{broker.ResultOK.String(), broker.ResultDuplicate.String(), broker.ResultStale.String(), broker.ResultError.String(),
	ResultManual, ResultBackfill}

// ResultBackfill is the result label of a backfill's slot published.
const ResultBackfill = "backfill"

// ResultManual is the result label of a manual trigger published.
const ResultManual = "manual"

var missedReasons = []string{ReasonWindow, ReasonOnce, ReasonMaxCatchup, ReasonSkip, ReasonPaused, ReasonRemoved, ReasonOverlap, ReasonMaxRuns}

// alertedOutcomes are the run outcomes whose series exist from the start,
// so rate() and absent-free alerts work before the first of them.
var alertedOutcomes = []outcome.Kind{outcome.Succeeded, outcome.Failed, outcome.Lost, outcome.Skipped}

// NewMetrics registers the scheduler's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		FireLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "beatd_fire_lag_seconds", Help: "Publish time minus the slot's due time.",
			Buckets: []float64{.001, .0025, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}),
		Entries:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_entries", Help: "Entries in the running config."}),
		EtcdErrors:    prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_etcd_errors_total", Help: "Failed etcd operations."}),
		RedisErrors:   prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_redis_errors_total", Help: "Failed Redis operations."}),
		PendingSlots:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_pending_slots", Help: "Slots due but not yet published, on the leader (grows while the broker is down)."}),
		PerEntryLimit: DefaultPerEntryLimit,
		stats:         newEntryStats(),
		StatePersistFailing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_state_persist_failing",
			Help: "1 while the leader's state writes to etcd fail (it keeps firing; the state waits in memory)."}),
		StateUnpersistedAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_state_unpersisted_age_seconds",
			Help: "Age of the oldest state change the leader has not yet written to etcd. With Redis no age is dangerous (the entries' marks outlive it); on RabbitMQ a backlog past the journal's horizon could duplicate."}),
	}
	m.Deduplicated = prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_fires_deduplicated_total",
		Help: "Slots the broker refused as already pushed by an earlier term (a failover's re-publish): each was published once, and counts as ok in beatd_fires_total."})
	m.PublishRetries = prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_publish_retries_total",
		Help: "Failed publishes of slots whose publish had failed before (a broker outage's retries). beatd_fires_total{result=\"error\"} counts each failed slot once."})
	m.Fires = newEntryCounterVec(m, "beatd_fires_total",
		"Slots by entry and result, each slot once: ok (published, by this term or, deduplicated, by an earlier one), error (its publish failed: counted once, at the first failure; it is retried and counts as ok once out), stale, manual, backfill; duplicate is no longer used. The entry label is empty past the per-entry limit.",
		"result", fireResults, fireResults)
	m.Runs = newEntryCounterVec(m, "beatd_runs_total",
		"Runs by entry and outcome as the workers reported it (published, received, started, retried, succeeded, failed, revoked, expired, lost, skipped). The entry label is empty past the per-entry limit.",
		"outcome", runOutcomes(), kindNames(alertedOutcomes))
	m.RunDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "beatd_run_duration_seconds",
		Help:    "The runtime workers report for beatd's runs (task-succeeded's runtime).",
		Buckets: []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200}})
	m.AutoPaused = prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_entries_auto_paused_total",
		Help: "Entries paused by pause_after_failures."})
	m.Missed = newEntryCounterVec(m, "beatd_missed_slots_total",
		"Slots not fired, by entry and reason. The entry label is empty past the per-entry limit.",
		"reason", missedReasons, missedReasons)
	reg.MustRegister(m.Deduplicated, m.PublishRetries)
	reg.MustRegister(m.Fires, m.FireLag, m.Missed, m.Runs, m.RunDuration, m.AutoPaused,
		m.Entries, m.EtcdErrors, m.RedisErrors, m.PendingSlots, m.StatePersistFailing, m.StateUnpersistedAge, &statsCollector{m})
	return m
}

// syncMetrics drops the entries' cached counters (entry.fires and
// entry.runs) once the Metrics switched between per-entry and aggregate
// series: the switch dropped the series they count into. A delta reload
// keeps the unchanged entries, and so their caches, across it.
func (l *loop) syncMetrics() {
	if g := l.s.cfg.Metrics.mode.Load(); g != l.metricsMode {
		l.metricsMode = g
		for _, e := range l.set.list {
			e.fires, e.runs = nil, nil
		}
	}
}

// runOutcomes is every value of beatd_runs_total's outcome label.
func runOutcomes() []string {
	out := make([]string, outcome.NumKinds)
	for k := range outcome.Kind(outcome.NumKinds) {
		out[k] = k.String()
	}
	return out
}

func kindNames(ks []outcome.Kind) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.String()
	}
	return out
}

// setEntries records the running config's entry names: it sets
// beatd_entries, chooses per-entry or aggregate series, and creates every
// series at 0 so alerts see them before the first event.
func (m *Metrics) setEntries(sc *config.Config) {
	names := make([]string, len(sc.Entries))
	for i, e := range sc.Entries {
		names[i] = e.Name
	}
	m.Entries.Set(float64(len(names)))
	perEntry := m.perEntryFor(len(names))
	was := m.stats.perEntry.Swap(perEntry)
	if was != perEntry {
		// Drop the other mode's series rather than export both.
		m.Fires.reset()
		m.Missed.reset()
		m.Runs.reset()
		m.mode.Add(1)
	}
	labels := names
	if !perEntry {
		labels = []string{""}
	}
	for _, n := range labels {
		m.createSeries(n)
	}
	m.stats.retain(names, perEntry)
}

// perEntryFor says whether n entries get series of their own.
func (m *Metrics) perEntryFor(n int) bool {
	limit := m.PerEntryLimit
	if limit <= 0 {
		limit = DefaultPerEntryLimit
	}
	return n <= limit
}

// createSeries makes entry's series (or the aggregate's, for "") at 0, so
// alerts see them before the first event.
func (m *Metrics) createSeries(entry string) {
	for _, v := range []*EntryCounterVec{m.Fires, m.Missed, m.Runs} {
		v.series(entry)
	}
}

// setEntriesDelta is setEntries after a change of the entries named only:
// it touches their series and stats, not every entry's.
func (m *Metrics) setEntriesDelta(sc *config.Config, changed []string) {
	perEntry := m.perEntryFor(len(sc.Entries))
	if perEntry != m.stats.perEntry.Load() {
		m.setEntries(sc) // the mode changes: every series does
		return
	}
	m.Entries.Set(float64(len(sc.Entries)))
	s := m.stats
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range changed {
		switch {
		case sc.Entry(n) == nil:
			delete(s.byName, n)
		case perEntry:
			s.stat(n)
			m.createSeries(n)
		}
	}
}

// Reasons a slot is not fired.
const (
	ReasonWindow     = "catchup_window" // older than catchup_window
	ReasonOnce       = "catchup_once"   // an older missed slot under catchup: once
	ReasonMaxCatchup = "max_catchup"    // beyond max_catchup under catchup: all
	ReasonSkip       = "catchup_skip"   // missed under catchup: skip
	ReasonPaused     = "paused"
	ReasonRemoved    = "removed"  // pending when its entry left the config
	ReasonOverlap    = "overlap"  // the previous run was unfinished (overlap: skip or buffer_one)
	ReasonMaxRuns    = "max_runs" // the entry had made its max_runs
)
