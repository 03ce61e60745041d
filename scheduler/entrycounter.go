package scheduler

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// EntryCounterVec is a counter family by entry and one more label whose
// values are known up front. Past the per-entry limit every entry counts
// under the empty entry label.
//
// It is its own collector rather than a prometheus.CounterVec because a
// CounterVec builds each series whole (label pairs, a hash entry and
// several objects) when it is first named, and beatd names every entry's
// ~18 series at start so that alerts see them at 0: at 1,000 entries that
// was ~15 % of the start-up's CPU, and its garbage most of the rest of the
// metrics' share. Here an entry's series are one slice of counts, and the
// label pairs are made at the first scrape, for entries that have one.
type EntryCounterVec struct {
	desc   *prometheus.Desc
	values []string       // the second label's values, in order
	index  map[string]int // value -> its position in values
	zeroed []bool         // values exported at 0 before their first count
	m      *Metrics

	mu      sync.RWMutex
	entries map[string]*entryCounters
	pairs   []*dto.LabelPair // one per value, shared by every entry
}

// entryCounters are one entry's series, one per value of the vec.
type entryCounters struct {
	counts []Counter
	labels [][]*dto.LabelPair // made at the first scrape
}

// Counter is one series of an EntryCounterVec.
type Counter struct{ bits atomic.Uint64 }

// Inc adds 1.
func (c *Counter) Inc() { c.Add(1) }

// Add adds v, which must not be negative.
func (c *Counter) Add(v float64) {
	if v < 0 {
		panic("scheduler: a counter cannot decrease")
	}
	for {
		old := c.bits.Load()
		if c.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// Value is the count.
func (c *Counter) Value() float64 { return math.Float64frombits(c.bits.Load()) }

// newEntryCounterVec makes a family whose second label is label, with
// values; those in zeroed are exported at 0 for every entry from its
// creation.
func newEntryCounterVec(m *Metrics, name, help, label string, values, zeroed []string) *EntryCounterVec {
	v := &EntryCounterVec{desc: prometheus.NewDesc(name, help, []string{entryLabel, label}, nil), values: values,
		index: make(map[string]int, len(values)), zeroed: make([]bool, len(values)), m: m,
		entries: map[string]*entryCounters{}}
	for i, s := range values {
		v.index[s] = i
		v.zeroed[i] = slices.Contains(zeroed, s)
		v.pairs = append(v.pairs, &dto.LabelPair{Name: &label, Value: &values[i]})
	}
	if label <= entryLabel {
		// A metric's label pairs go out sorted by name, "entry" first.
		panic("scheduler: an entry counter's second label must sort after \"entry\"")
	}
	return v
}

// WithLabelValues returns the counter of entry and the second label,
// creating the entry's series if it had none.
func (v *EntryCounterVec) WithLabelValues(entry, label string) *Counter {
	i, ok := v.index[label]
	if !ok {
		panic(fmt.Sprintf("scheduler: %q is not a value of %s", label, v.desc))
	}
	if !v.m.stats.perEntry.Load() {
		entry = ""
	}
	return &v.series(entry).counts[i]
}

// series returns entry's counters, creating them.
func (v *EntryCounterVec) series(entry string) *entryCounters {
	v.mu.RLock()
	e := v.entries[entry]
	v.mu.RUnlock()
	if e != nil {
		return e
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if e = v.entries[entry]; e == nil {
		e = &entryCounters{counts: make([]Counter, len(v.values))}
		v.entries[entry] = e
	}
	return e
}

// reset drops every series.
func (v *EntryCounterVec) reset() {
	v.mu.Lock()
	defer v.mu.Unlock()
	clear(v.entries)
}

// value is the count of entry and label, for tests.
func (v *EntryCounterVec) value(entry, label string) float64 {
	return v.WithLabelValues(entry, label).Value()
}

// Describe implements prometheus.Collector.
func (v *EntryCounterVec) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

// Collect implements prometheus.Collector: every entry's zeroed series,
// and the others once counted.
func (v *EntryCounterVec) Collect(ch chan<- prometheus.Metric) {
	// The lock covers the label pairs' making, not the sends: a reload
	// that names a new entry waits for the first, not for the scrape.
	v.mu.Lock()
	all := make([]*entryCounters, 0, len(v.entries))
	for name, e := range v.entries {
		if e.labels == nil {
			entryPair := &dto.LabelPair{Name: &entryLabel, Value: &name}
			e.labels = make([][]*dto.LabelPair, len(v.values))
			flat := make([]*dto.LabelPair, 2*len(v.values))
			for i := range v.values {
				flat[2*i], flat[2*i+1] = entryPair, v.pairs[i]
				e.labels[i] = flat[2*i : 2*i+2 : 2*i+2]
			}
		}
		all = append(all, e)
	}
	v.mu.Unlock()
	for _, e := range all {
		for i := range e.counts {
			if n := e.counts[i].Value(); n != 0 || v.zeroed[i] {
				ch <- counterSample{desc: v.desc, labels: e.labels[i], value: n}
			}
		}
	}
}

// entryLabel is the first label's name, shared by every entry's pairs.
var entryLabel = "entry"

// counterSample is one series at a scrape. Its label pairs are shared
// between scrapes, as prometheus' own counters share theirs.
type counterSample struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	value  float64
}

func (s counterSample) Desc() *prometheus.Desc { return s.desc }

func (s counterSample) Write(m *dto.Metric) error {
	m.Label = s.labels
	m.Counter = &dto.Counter{Value: &s.value}
	return nil
}
