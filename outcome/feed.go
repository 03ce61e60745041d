package outcome

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// Source is where a report came from.
type Source uint8

// The sources of reports.
const (
	FromEvents  Source = iota // the workers' task events (celery worker -E)
	FromResults               // the result backend (--result-backend)
	numSources
)

func (s Source) String() string {
	if s == FromResults {
		return "result_backend"
	}
	return "task_events"
}

// Report is an event about one of beatd's runs, with its entry and the
// step of the run's chain its task id is (0: the run's own task).
type Report struct {
	Entry string
	Event
	Source Source
	Step   int
}

// Feed is where the consumers' events meet the scheduler. It passes on
// only reports about the task ids the leader watches (its unfinished
// runs, at most a few per entry, with their chains' steps), so a
// worker's other tasks cost one map lookup each and the feed's memory is
// bounded by the entries, never by the fires. It is safe for concurrent
// use.
//
// A sharded replica runs a scheduler loop per shard, all fed by the one
// set of consumers: each loop reads a Sub of the feed, which shares the
// feed's watches, held reports and counters but has its own reports and
// Early, so a report reaches the loop that watched its task id.
type Feed struct {
	h *hub
	c chan Report
	// early holds the reports matched by Watch from the held ones, for
	// this feed's loop; guarded by h.mu.
	early  []Report
	nEarly atomic.Int32
}

// hub is what a feed and its subs share: one set of consumers deliver to
// it, and each watched id says which of them reads its reports.
type hub struct {
	clock clockwork.Clock

	mu      sync.Mutex
	watched map[string]watch
	// unwatched is the newest report of each task id no one watched, for
	// a while: a worker's report that came during a leaderless gap or a
	// handover (every replica listens) reaches its run once the new
	// leader watches it.
	unwatched unwatched

	last    [numSources]atomic.Int64 // Unix ns of the newest report of any task
	reports [numSources]atomic.Uint64
	matched [numSources]atomic.Uint64
}

// watch is one watched task id. since is Unix ns, not a time.Time: a
// million entries with a run out each hold a million watches.
type watch struct {
	entry string
	since int64
	to    *Feed
	step  uint8
}

// NewFeed returns a feed whose reports wait in a buffer of size buffer
// until the scheduler reads them.
func NewFeed(clock clockwork.Clock, buffer int) *Feed {
	return &Feed{h: &hub{clock: clock, watched: map[string]watch{}}, c: make(chan Report, buffer)}
}

// Sub returns a feed fed by f's consumers that passes on the reports
// about the task ids it watches, in a buffer of its own of size buffer.
// Its counters and LastReport are f's.
func (f *Feed) Sub(buffer int) *Feed {
	return &Feed{h: f.h, c: make(chan Report, buffer)}
}

// Reports is what the scheduler reads.
func (f *Feed) Reports() <-chan Report { return f.c }

// Watch passes on reports about task id, as entry's, from now on and
// the newest one that came before, if the feed still holds it (Early).
func (f *Feed) Watch(id, entry string) { f.WatchStep(id, entry, 0) }

// WatchStep is Watch for the task id of step n of a run's chain (n ≤
// celery.MaxChainSteps): its reports say so (Report.Step).
func (f *Feed) WatchStep(id, entry string, n int) {
	h := f.h
	h.mu.Lock()
	h.watched[id] = watch{entry: entry, since: h.clock.Now().UnixNano(), to: f, step: uint8(n)}
	if ev, ok := h.unwatched.take(id); ok {
		f.early = append(f.early, Report{Entry: entry, Event: ev.Event, Source: ev.src, Step: n})
		f.nEarly.Add(1)
	}
	h.mu.Unlock()
}

// Early appends to dst the reports that came before their task id was
// watched, and forgets them.
func (f *Feed) Early(dst []Report) []Report {
	if f.nEarly.Load() == 0 {
		return dst
	}
	f.h.mu.Lock()
	dst = append(dst, f.early...)
	clear(f.early)
	f.early = f.early[:0]
	f.nEarly.Store(0)
	f.h.mu.Unlock()
	return dst
}

// Unwatch stops passing on reports about id.
func (f *Feed) Unwatch(id string) {
	f.h.mu.Lock()
	delete(f.h.watched, id)
	f.h.mu.Unlock()
}

// Clear unwatches everything f watches: a term ended or begins. The
// reports waiting in f's buffer go back to the held ones, so a loop that
// watches their ids again (this replica's next term) still gets them,
// and a loop that no longer reads f never blocks Deliver: nothing is
// passed on to f until it watches again.
func (f *Feed) Clear() {
	h := f.h
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, w := range h.watched {
		if w.to == f {
			delete(h.watched, id)
		}
	}
	clear(f.early)
	f.early = f.early[:0]
	f.nEarly.Store(0)
	now := h.clock.Now()
	for {
		select {
		case r := <-f.c:
			h.unwatched.keep(r.Event, r.Source, now)
		default:
			return
		}
	}
}

// WatchedSince returns the ids watched since before t, for a result
// backend to look up what its notifications may have missed: runs' own
// tasks first, then chain steps in their order. The backend marks the
// steps after a failed one failed too, with its exception; read in this
// order, the step that failed is reported before them.
func (f *Feed) WatchedSince(t time.Time, dst []string) []string {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	start, before := len(dst), t.UnixNano()
	for id, w := range f.h.watched {
		if w.since <= before {
			dst = append(dst, id)
		}
	}
	slices.SortFunc(dst[start:], func(a, b string) int {
		return cmp.Compare(f.h.watched[a].step, f.h.watched[b].step)
	})
	return dst
}

// Deliver passes on the watched ones of evs, each to the feed (f or a
// Sub) that watches it. It blocks while that buffer is full (its
// scheduler is busy publishing), until ctx ends.
func (f *Feed) Deliver(ctx context.Context, src Source, evs []Event) {
	if len(evs) == 0 {
		return
	}
	h := f.h
	h.last[src].Store(h.clock.Now().UnixNano())
	h.reports[src].Add(uint64(len(evs)))
	type routed struct {
		to *Feed
		r  Report
	}
	var out []routed
	now := h.clock.Now()
	h.mu.Lock()
	for _, e := range evs {
		if w, ok := h.watched[e.TaskID]; ok {
			out = append(out, routed{to: w.to, r: Report{Entry: w.entry, Event: e, Source: src, Step: int(w.step)}})
		} else {
			h.unwatched.keep(e, src, now)
		}
	}
	h.mu.Unlock()
	h.matched[src].Add(uint64(len(out)))
	for _, o := range out {
		select {
		case o.to.c <- o.r:
		case <-ctx.Done():
			return
		}
	}
}

// LastReport is when src last reported about any task (zero: never).
func (f *Feed) LastReport(src Source) time.Time {
	if ns := f.h.last[src].Load(); ns != 0 {
		return time.Unix(0, ns).UTC()
	}
	return time.Time{}
}

// LastAnyReport is when any source last reported about any task (zero:
// never): whether beatd can see outcomes at all.
func (f *Feed) LastAnyReport() time.Time {
	last := f.LastReport(FromEvents)
	if t := f.LastReport(FromResults); t.After(last) {
		last = t
	}
	return last
}

// Collectors returns the feed's metrics.
func (f *Feed) Collectors() []prometheus.Collector {
	var cs []prometheus.Collector
	for s := range numSources {
		l := prometheus.Labels{"source": s.String()}
		cs = append(cs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "beatd_outcome_reports_total", ConstLabels: l,
				Help: "Task reports read from the source, about any task."}, func() float64 { return float64(f.h.reports[s].Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "beatd_outcome_reports_matched_total", ConstLabels: l,
				Help: "Task reports read from the source about one of beatd's unfinished runs."}, func() float64 { return float64(f.h.matched[s].Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "beatd_outcome_last_report_timestamp_seconds", ConstLabels: l,
				Help: "When the source last reported about any task (0: never since start)."}, func() float64 {
				if t := f.LastReport(s); !t.IsZero() {
					return float64(t.UnixNano()) / 1e9
				}
				return 0
			}))
	}
	return cs
}

// unwatched holds the newest report of task ids no one watched, up to
// unwatchedCap ids and unwatchedAge old, oldest out first. Received
// events are left out: a run's end, and its start, are what a new
// leader needs, and most of a busy worker's events are other tasks'.
type unwatched struct {
	byID map[string]heldEvent
	// ring holds the ids in arrival order: n of them from head.
	ring    []heldID
	head, n int
}

type heldEvent struct {
	Event
	src Source
	at  time.Time
}

type heldID struct {
	id string
	at time.Time
}

const (
	// unwatchedCap bounds the memory (~10 MB) whatever the workers run.
	unwatchedCap = 32768
	// unwatchedAge covers a failover (lease TTL and a start) many times.
	unwatchedAge = 10 * time.Minute
)

func (u *unwatched) keep(e Event, src Source, now time.Time) {
	if e.Kind == Received || e.Kind == Unknown {
		return
	}
	if u.byID == nil {
		u.byID = map[string]heldEvent{}
		u.ring = make([]heldID, unwatchedCap)
	}
	if old, ok := u.byID[e.TaskID]; ok {
		if e.Kind.Supersedes(old.Kind) {
			u.byID[e.TaskID] = heldEvent{Event: e, src: src, at: old.at}
		}
		return
	}
	for u.n > 0 && (u.n == len(u.ring) || now.Sub(u.ring[u.head].at) > unwatchedAge) {
		u.drop()
	}
	u.ring[(u.head+u.n)%len(u.ring)] = heldID{id: e.TaskID, at: now}
	u.n++
	u.byID[e.TaskID] = heldEvent{Event: e, src: src, at: now}
}

// drop forgets the oldest id (unless taken, or held anew, since).
func (u *unwatched) drop() {
	old := u.ring[u.head]
	if h, ok := u.byID[old.id]; ok && h.at.Equal(old.at) {
		delete(u.byID, old.id)
	}
	u.ring[u.head] = heldID{}
	u.head = (u.head + 1) % len(u.ring)
	u.n--
}

func (u *unwatched) take(id string) (heldEvent, bool) {
	h, ok := u.byID[id]
	if ok {
		delete(u.byID, id)
	}
	return h, ok
}
