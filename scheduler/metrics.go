package scheduler

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are beatd's Prometheus metrics. The loop updates the firing
// ones; the daemon updates leadership, reload and client error ones.
type Metrics struct {
	IsLeader      prometheus.Gauge
	FencingToken  prometheus.Gauge
	LeaderChanges prometheus.Counter
	Fires         *prometheus.CounterVec // entry, result
	FireLag       prometheus.Histogram
	Missed        *prometheus.CounterVec // entry, reason
	Entries       prometheus.Gauge
	Reloads       *prometheus.CounterVec // result
	ReloadOK      prometheus.Gauge
	EtcdErrors    prometheus.Counter
	RedisErrors   prometheus.Counter
	// StatePersistFailing is 1 while the leader's state writes fail.
	StatePersistFailing prometheus.Gauge
	// StateUnpersistedAge is the age of the oldest state change not yet
	// written to etcd.
	StateUnpersistedAge prometheus.Gauge
}

// NewMetrics registers beatd's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		IsLeader:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_is_leader", Help: "1 while this replica leads."}),
		FencingToken:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_fencing_token", Help: "The fencing token of this replica's current or last term."}),
		LeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_leader_changes_total", Help: "Terms this replica started or ended."}),
		Fires:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "beatd_fires_total", Help: "Publishes by entry and result (ok, duplicate, stale, error)."}, []string{"entry", "result"}),
		FireLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "beatd_fire_lag_seconds", Help: "Publish time minus the slot's due time.",
			Buckets: []float64{.001, .0025, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}),
		Missed:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "beatd_missed_slots_total", Help: "Slots not fired, by entry and reason."}, []string{"entry", "reason"}),
		Entries:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_entries", Help: "Entries in the running config."}),
		Reloads:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "beatd_config_reloads_total", Help: "Config reloads by result."}, []string{"result"}),
		ReloadOK:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_config_last_reload_successful", Help: "1 if the last config reload succeeded."}),
		EtcdErrors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_etcd_errors_total", Help: "Failed etcd operations."}),
		RedisErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "beatd_redis_errors_total", Help: "Failed Redis operations."}),
		StatePersistFailing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_state_persist_failing",
			Help: "1 while the leader's state writes to etcd fail (it keeps firing; the state waits in memory)."}),
		StateUnpersistedAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "beatd_state_unpersisted_age_seconds",
			Help: "Age of the oldest state change the leader has not yet written to etcd; past the dedup TTL a failover could duplicate."}),
	}
	m.ReloadOK.Set(1)
	reg.MustRegister(m.IsLeader, m.FencingToken, m.LeaderChanges, m.Fires, m.FireLag, m.Missed,
		m.Entries, m.Reloads, m.ReloadOK, m.EtcdErrors, m.RedisErrors, m.StatePersistFailing, m.StateUnpersistedAge)
	return m
}

// Reasons a slot is not fired.
const (
	ReasonWindow     = "catchup_window" // older than catchup_window
	ReasonOnce       = "catchup_once"   // an older missed slot under catchup: once
	ReasonMaxCatchup = "max_catchup"    // beyond max_catchup under catchup: all
	ReasonSkip       = "catchup_skip"   // missed under catchup: skip
	ReasonPaused     = "paused"
	ReasonRemoved    = "removed" // pending when its entry left the config
)
