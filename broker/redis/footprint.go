package redis

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Footprint is what beatd keeps in Redis: O(entries), never O(fires).
type Footprint struct {
	// Entries is how many entries have published (a field each in the
	// entries registry); each has one history list, whose newest record is
	// its mark.
	Entries int64
	// Keys counts beatd's keys: the fence, slots-term, the registry, one
	// history list per entry, and the legacy flag while it lives.
	// Manual triggers' keys (one per trigger, for TriggerTTL) and the
	// previous release's dedup keys (until they expire) are not counted:
	// finding them would take a SCAN of the whole broker.
	Keys int64
	// Legacy is whether the previous release's dedup keys are honoured
	// (and written) still.
	Legacy bool
}

// Footprint reads beatd's footprint in one pipelined round trip.
func (p *Publisher) Footprint(ctx context.Context) (Footprint, error) {
	pipe := p.rdb.Pipeline()
	entries := pipe.HLen(ctx, p.entriesKey())
	fixed := pipe.Exists(ctx, p.fenceKey, p.slotsTermKey(), p.entriesKey())
	legacy := pipe.Exists(ctx, p.legacyKey())
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return Footprint{}, err
	}
	f := Footprint{Entries: entries.Val(), Legacy: legacy.Val() == 1}
	f.Keys = fixed.Val() + legacy.Val() + f.Entries // one history list each
	return f, nil
}

// FootprintCollector exports Footprint as beatd_broker_keys,
// beatd_broker_entries and beatd_broker_legacy_dedup, read from Redis at
// each scrape (three O(1) commands); absent while Redis does not answer.
func (p *Publisher) FootprintCollector() prometheus.Collector { return footprintCollector{p} }

type footprintCollector struct{ p *Publisher }

var (
	descBrokerKeys = prometheus.NewDesc("beatd_broker_keys",
		"beatd's keys in Redis (fence, slots-term, the entries registry, one run history per entry, the legacy flag); excludes manual triggers' keys and the previous release's dedup keys.", nil, nil)
	descBrokerEntries = prometheus.NewDesc("beatd_broker_entries",
		"Entries that have published, each with a high-water mark in its run history in Redis.", nil, nil)
	descBrokerLegacy = prometheus.NewDesc("beatd_broker_legacy_dedup",
		"1 while the previous release's per-fire dedup keys are honoured and written (after an upgrade, for the dedup TTL).", nil, nil)
)

func (c footprintCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBrokerKeys
	ch <- descBrokerEntries
	ch <- descBrokerLegacy
}

// footprintBudget bounds the scrape's Redis read: a scrape must answer
// promptly while this replica's path to Redis is cut.
const footprintBudget = 300 * time.Millisecond

func (c footprintCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), footprintBudget)
	defer cancel()
	f, err := c.p.Footprint(ctx)
	if err != nil {
		// The broker is down: say nothing rather than fail the whole
		// scrape; beatd_dependency_up{dependency="broker"} says why.
		return
	}
	legacy := 0.0
	if f.Legacy {
		legacy = 1
	}
	ch <- prometheus.MustNewConstMetric(descBrokerKeys, prometheus.GaugeValue, float64(f.Keys))
	ch <- prometheus.MustNewConstMetric(descBrokerEntries, prometheus.GaugeValue, float64(f.Entries))
	ch <- prometheus.MustNewConstMetric(descBrokerLegacy, prometheus.GaugeValue, legacy)
}
