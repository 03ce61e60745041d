package scheduler

import (
	"container/heap"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/unixns"
	"github.com/prometheus/client_golang/prometheus"
)

// An entry is flagged when the loop cannot run it as its spec says:
//   - behind: its slots come due faster than the loop publishes them (an
//     interval below what the loop sustains, admitted by --min-interval),
//     so it gets its share of each pass and no more (collectDue);
//   - runaway: its schedule went wrong (a slot not after the one before,
//     or a catch-up plan outside time), so the loop stops it rather than
//     spin on it. A new definition (reload, PUT) starts it afresh.
//
// Both show in /status, beatd_entries_behind and beatd_entries_runaway,
// and make /readyz answer 503 (Scheduler.Health).
const (
	HealthBehind  = "behind"
	HealthRunaway = "runaway"
)

// minSlot is the earliest slot a sane schedule gives: config refuses
// times before it, so an earlier one is arithmetic that wrapped.
var minSlot = time.Unix(0, 0)

// insane says why a catch-up plan cannot come from a sane schedule, or "".
// planCatchup only ever plans slots up to now, in order, and a next slot
// whose due time is after now.
func (p catchupPlan) insane(e *config.Entry, now time.Time) string {
	for i, s := range p.fire {
		if s.Before(minSlot) || s.After(now) || i > 0 && !s.After(p.fire[i-1]) {
			return fmt.Sprintf("its catch-up planned slot %s", s.UTC().Format(time.RFC3339Nano))
		}
	}
	if !p.next.IsZero() && (p.next.Before(minSlot) || !p.next.Add(e.Jitter).After(now)) {
		return fmt.Sprintf("its next slot after %s is %s", now.UTC().Format(time.RFC3339), p.next.UTC().Format(time.RFC3339Nano))
	}
	return ""
}

// entryFlags are the entries the loop flagged, by name: the flags
// outlive a reload that keeps the entry.
type entryFlags struct {
	behind  map[string]bool
	runaway map[string]bool
}

// stopRunaway takes e out of the heap and flags it.
func (l *loop) stopRunaway(e *entry, why string, now time.Time) {
	if it := e.it; it != nil {
		if it.index >= 0 && it.index < len(l.heap) && l.heap[it.index] == it {
			heap.Remove(&l.heap, it.index)
		}
		e.it = nil
	}
	l.s.cfg.Metrics.scheduled(e.Name, time.Time{})
	if l.flags.runaway == nil {
		l.flags.runaway = map[string]bool{}
	}
	delete(l.flags.behind, e.Name)
	if l.flags.runaway[e.Name] {
		return
	}
	l.flags.runaway[e.Name] = true
	reason := "schedule stopped: " + why
	l.s.cfg.Metrics.flag(e.Name, HealthRunaway, reason, now)
	l.s.log.Error("runaway entry stopped: its schedule went wrong; change or remove it to start it again",
		"entry", e.Name, "reason", why)
}

// fallBehind flags e, whose slots are still due after its share of a pass.
func (l *loop) fallBehind(e *entry, now time.Time) {
	if l.flags.behind[e.Name] {
		return
	}
	if l.flags.behind == nil {
		l.flags.behind = map[string]bool{}
	}
	l.flags.behind[e.Name] = true
	reason := fmt.Sprintf("slots come due faster than the loop publishes them; it gets %d a pass", entryShare)
	l.s.cfg.Metrics.flag(e.Name, HealthBehind, reason, now)
	l.s.log.Warn("entry behind its schedule: its slots pile up; the others keep their time",
		"entry", e.Name)
}

// caughtUp clears e's behind flag once its next slot is ahead.
func (l *loop) caughtUp(e *entry, now time.Time) {
	if !l.flags.behind[e.Name] {
		return
	}
	delete(l.flags.behind, e.Name)
	l.s.cfg.Metrics.unflag(e.Name)
	l.s.log.Info("entry caught up with its schedule", "entry", e.Name)
}

// clearFlags drops name's flags.
func (l *loop) clearFlags(name string) {
	if l.flags.behind[name] || l.flags.runaway[name] {
		delete(l.flags.behind, name)
		delete(l.flags.runaway, name)
		l.s.cfg.Metrics.unflag(name)
	}
}

// purgeFlags drops the flags of entries no longer configured.
func (l *loop) purgeFlags() {
	for _, m := range []map[string]bool{l.flags.behind, l.flags.runaway} {
		for name := range m {
			if l.set.get(name) == nil {
				l.clearFlags(name)
			}
		}
	}
}

// lateLog summarises collectDue's slots found late in one line every
// repeatEvery: a loop that finds slots late finds them again each pass,
// and a line each time was thousands a minute.
type lateLog struct {
	every         repeatLog
	entries, slot int
}

func (g *lateLog) add(fired int) { g.entries++; g.slot += fired }

func (g *lateLog) flush(log *slog.Logger, now time.Time) {
	if g.entries == 0 {
		return
	}
	if ok, _ := g.every.allow(now); !ok {
		return
	}
	log.Warn("slots found late (a wall-clock step forward, or a stalled loop): each entry's catch-up policy applies",
		"entries", g.entries, "fired", g.slot, "late_over", stepLateness.String(), "summary_of", repeatEvery.String())
	g.entries, g.slot = 0, 0
}

// repeatLog lets a line that can repeat out once every repeatEvery, and
// counts the times it held back in between.
type repeatLog struct {
	next time.Time
	held int
}

// repeatEvery is how often a repeating line is logged at most.
const repeatEvery = 10 * time.Second

// allow says whether the line goes out now, and how many were held back
// since the last one that did.
func (r *repeatLog) allow(now time.Time) (ok bool, held int) {
	if now.Before(r.next) {
		r.held++
		return false, 0
	}
	held, r.held, r.next = r.held, 0, now.Add(repeatEvery)
	return true, held
}

// entryFlag is a flagged entry's record in entryStats.
type entryFlag struct {
	kind   string
	reason string
	since  int64
}

func (m *Metrics) flag(name, kind, reason string, now time.Time) {
	s := m.stats
	s.mu.Lock()
	if s.flags == nil {
		s.flags = map[string]entryFlag{}
	}
	s.flags[name] = entryFlag{kind: kind, reason: reason, since: now.UnixNano()}
	s.mu.Unlock()
}

func (m *Metrics) unflag(name string) {
	s := m.stats
	s.mu.Lock()
	delete(s.flags, name)
	s.mu.Unlock()
}

// loopLagLimit is how late the loop's next slot may be before /readyz
// says the loop is not keeping up. A 20,000-slot burst is out in ~0.2 s.
const loopLagLimit = 5 * time.Second

// Health is nil while this replica's loop keeps the schedule: no entry
// is runaway or behind, and its next slot is not late by loopLagLimit.
// /readyz answers 503 with the error otherwise.
func (s *Scheduler) Health(now time.Time) error {
	st := s.cfg.Metrics.stats
	st.mu.Lock()
	leading := st.leading
	byKind := map[string][]string{}
	for name, f := range st.flags {
		byKind[f.kind] = append(byKind[f.kind], name)
	}
	st.mu.Unlock()
	if !leading {
		return nil
	}
	var errs []error
	if names := byKind[HealthRunaway]; len(names) > 0 {
		errs = append(errs, fmt.Errorf("scheduler: runaway entries stopped (their schedules went wrong): %s", nameList(names)))
	}
	if names := byKind[HealthBehind]; len(names) > 0 {
		errs = append(errs, fmt.Errorf("scheduler: entries behind their schedule (slots pile up faster than they are published): %s", nameList(names)))
	}
	if due := st.heapDue.Load(); len(errs) == 0 && due != 0 && now.Sub(unixns.Time(due)) > loopLagLimit {
		errs = append(errs, fmt.Errorf("scheduler: loop not keeping up: a slot due at %s is %s late",
			unixns.Time(due).UTC().Format(time.RFC3339), now.Sub(unixns.Time(due)).Round(time.Second)))
	}
	return errors.Join(errs...)
}

// nameList names up to five entries, in order, and counts the rest.
func nameList(names []string) string {
	sort.Strings(names)
	if len(names) <= 5 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:5], ", "), len(names)-5)
}

var (
	descBehind = prometheus.NewDesc("beatd_entries_behind",
		"Entries whose slots come due faster than the leader publishes them: each gets its share of the loop and no more. Leader only.", nil, nil)
	descRunaway = prometheus.NewDesc("beatd_entries_runaway",
		"Entries the leader stopped because their schedule went wrong (a slot not after the one before). Leader only.", nil, nil)
)

// collectFlags exports the flag counts; the caller holds s.mu.
func (s *entryStats) collectFlags(ch chan<- prometheus.Metric) {
	var behind, runaway int
	for _, f := range s.flags {
		switch f.kind {
		case HealthBehind:
			behind++
		case HealthRunaway:
			runaway++
		}
	}
	ch <- prometheus.MustNewConstMetric(descBehind, prometheus.GaugeValue, float64(behind))
	ch <- prometheus.MustNewConstMetric(descRunaway, prometheus.GaugeValue, float64(runaway))
}
