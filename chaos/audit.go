package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/schedule"

	"github.com/redis/go-redis/v9"
)

// Message is one enqueued task, as the audit reads it.
type Message struct {
	Entry  string    `json:"entry"`
	Slot   time.Time `json:"slot"`
	Token  int64     `json:"token"`
	TaskID string    `json:"task_id"`
	Manual bool      `json:"manual,omitempty"`
}

// SlotRef names one (entry, slot).
type SlotRef struct {
	Entry  string    `json:"entry"`
	Slot   time.Time `json:"slot"`
	Count  int       `json:"count,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

// Stats summarises durations, in seconds.
type Stats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_s"`
	P99   float64 `json:"p99_s"`
	Max   float64 `json:"max_s"`
}

// StatsOf is the count, median, 99th percentile and maximum of ds: a
// drill's report, and the benches that time what a drill times.
func StatsOf(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	pick := func(p float64) float64 { return s[min(len(s)-1, int(float64(len(s))*p))].Seconds() }
	return Stats{Count: len(s), P50: pick(0.5), P99: pick(0.99), Max: s[len(s)-1].Seconds()}
}

// Report is a drill's outcome.
type Report struct {
	Seed          int64            `json:"seed,omitempty"`
	Duration      string           `json:"duration,omitempty"`
	Replicas      int              `json:"replicas,omitempty"`
	From          time.Time        `json:"from"`
	To            time.Time        `json:"to"`
	Messages      int              `json:"messages"`
	ExpectedSlots int              `json:"expected_slots"`
	Duplicates    []SlotRef        `json:"duplicates"`
	Missed        []SlotRef        `json:"missed"`
	Dropped       []SlotRef        `json:"dropped_by_policy"`
	StaleRejected int              `json:"stale_publishes_rejected"`
	LeaderChanges int              `json:"leader_changes"`
	Faults        []Fault          `json:"faults,omitempty"`
	FailoverGaps  map[string]Stats `json:"failover_gap_by_fault,omitempty"`
	// Handovers: from a fault that moves leadership to a newer term's
	// election (the first fire may wait for the next slot after that).
	Handovers map[string]Stats `json:"handover_by_fault,omitempty"`
	FireLag   Stats            `json:"fire_lag"`
	OK        bool             `json:"ok"`
	// RabbitMQ drills only: duplicates explained by a logged re-send (the
	// documented window), the re-sends logged, and messages enqueued after
	// a newer term's (publishes from a fenced term).
	DuplicatesInWindow []SlotRef `json:"duplicates_in_window,omitempty"`
	Resends            int       `json:"amqp_resends,omitempty"`
	FencedPublishes    int       `json:"fenced_publishes,omitempty"`
	// ResendsAllTerms is the final leader's beatd_amqp_resends_all_terms
	// (summed over entries): it must cover every extra copy.
	ResendsAllTerms float64 `json:"amqp_resends_all_terms,omitempty"`
	// Sharded drills only: the final shard count, the counts each resize
	// went to, publishes of a paused replica's terms once others led its
	// shards (any fails), shards left without a running leader after a
	// fault (any fails), and each shard handover's time from the old
	// leader's handover to the new one's scheduling.
	Shards         int       `json:"shards,omitempty"`
	Resizes        []int     `json:"resizes,omitempty"`
	WokenPublishes []SlotRef `json:"woken_publishes,omitempty"`
	StuckShards    []string  `json:"stuck_shards,omitempty"`
	ShardMoves     Stats     `json:"shard_moves,omitzero"`
	// Unbalanced are joins handed their share while the other replicas
	// were not balanced among themselves within 20 s (not a failure).
	Unbalanced []string `json:"unbalanced,omitempty"`
}

// ReadQueue reads every message in a queue and its priority sub-queues
// without consuming them.
func ReadQueue(ctx context.Context, rdb redis.UniversalClient, queue string) ([]Message, error) {
	var out []Message
	for _, key := range []string{queue, queue + "\x06\x163", queue + "\x06\x166", queue + "\x06\x169"} {
		raws, err := rdb.LRange(ctx, key, 0, -1).Result()
		if err != nil {
			return nil, fmt.Errorf("chaos: read %q: %w", key, err)
		}
		for _, raw := range raws {
			if m, ok := ParseMessage([]byte(raw)); ok {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// ParseMessage reads the beatd headers of one message as Kombu's Redis
// transport stores it; ok is false for a message beatd did not send.
func ParseMessage(raw []byte) (m Message, ok bool) {
	var msg struct {
		Headers struct {
			ID     string `json:"id"`
			Entry  string `json:"beat_entry"`
			Slot   string `json:"beat_slot"`
			Token  int64  `json:"beat_fencing_token"`
			Manual bool   `json:"beat_manual"`
		} `json:"headers"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil || msg.Headers.Entry == "" {
		return Message{}, false
	}
	slot, err := time.Parse(time.RFC3339Nano, msg.Headers.Slot)
	if err != nil {
		return Message{}, false
	}
	h := msg.Headers
	return Message{Entry: h.Entry, Slot: slot, Token: h.Token, TaskID: h.ID, Manual: h.Manual}, true
}

// Audit checks messages against cfg for slots in [from, to]:
//   - a duplicate is an (entry, slot) enqueued more than once (anywhere);
//   - a slot the schedule says is due and that never arrived is missed,
//     unless the entry's catch-up policy drops it: under once or skip, the
//     slots of an outage are dropped when a new leader (a larger fencing
//     token) took over across them; under all, only beyond max_catchup or
//     catchup_window. Dropped slots are listed apart, with the reason.
//
// Term is one leadership term: when it was elected and its token.
type Term struct {
	Start time.Time
	Token int64
	// Shard and Count name the shard the term led, among Count; Count 0
	// is an unsharded cluster's term, which leads every entry.
	Shard, Count int
}

// leads says whether the term led the entry named name.
func (t Term) leads(name string) bool {
	return t.Count == 0 || keys.ShardOf(name, t.Count) == t.Shard
}

// Audit judges takeovers by the tokens on either side of a run of missing
// slots; AuditWithTerms, when the leadership timeline is known, by whether
// a term began during the run.
func Audit(cfg *config.Config, msgs []Message, from, to time.Time) *Report {
	return AuditWithTerms(cfg, msgs, from, to, nil)
}

// AuditWithTerms is Audit with the terms elected during the drill: a run of
// missing slots counts as an outage a catch-up policy may drop when a term
// began after its first slot, no later than the term that published the
// next slot.
func AuditWithTerms(cfg *config.Config, msgs []Message, from, to time.Time, terms []Term) *Report {
	return AuditWithTimeline(cfg, msgs, from, to, terms, nil)
}

// StepLateness mirrors the scheduler's stepLateness (scheduler/catchup.go):
// a slot still pending this long after it was due, because its publishes
// kept failing (a broker down that long), goes through its entry's
// catch-up policy within the same term, as at a takeover.
const StepLateness = 30 * time.Second

// FiredKey is the key of fired: an entry and its slot.
func FiredKey(entry string, slot time.Time) string {
	return entry + "\x00" + slot.UTC().Format(time.RFC3339Nano)
}

// AuditWithTimeline is AuditWithTerms with when each published slot was
// fired (FiredKey; from the replicas' "fired" lines): under once or skip,
// a missing slot more than StepLateness older than the fire of the
// entry's next published slot was dropped by its policy while pending,
// as the scheduler does, with or without a takeover.
func AuditWithTimeline(cfg *config.Config, msgs []Message, from, to time.Time, terms []Term, fired map[string]time.Time) *Report {
	r := &Report{From: from, To: to, Messages: len(msgs), Duplicates: []SlotRef{}, Missed: []SlotRef{}, Dropped: []SlotRef{}}
	type pub struct {
		count int
		token int64
	}
	byEntry := map[string]map[int64]*pub{}
	for _, m := range msgs {
		if m.Manual {
			continue
		}
		slots := byEntry[m.Entry]
		if slots == nil {
			slots = map[int64]*pub{}
			byEntry[m.Entry] = slots
		}
		k := m.Slot.UnixNano()
		p := slots[k]
		if p == nil {
			p = &pub{}
			slots[k] = p
		}
		p.count++
		p.token = max(p.token, m.Token)
	}
	for name, slots := range byEntry {
		for k, p := range slots {
			if p.count > 1 {
				r.Duplicates = append(r.Duplicates, SlotRef{Entry: name, Slot: time.Unix(0, k).UTC(), Count: p.count})
			}
		}
	}
	for _, e := range cfg.Entries {
		if !e.Enabled {
			continue
		}
		var expected []time.Time
		for s := e.Schedule.Next(from.Add(-time.Nanosecond)); !s.IsZero() && !s.After(to); s = e.Schedule.Next(s) {
			expected = append(expected, s)
		}
		r.ExpectedSlots += len(expected)
		slots := byEntry[e.Name]
		published := func(s time.Time) *pub { return slots[s.UnixNano()] }
		// nearest returns the token of the closest published slot before or
		// after t: who published on each side of a run of missing slots.
		nearestSlot := func(t time.Time, before bool) (int64, int64) {
			var best, tok int64
			found := false
			for k, p := range slots {
				if before && k < t.UnixNano() && (!found || k > best) || !before && k > t.UnixNano() && (!found || k < best) {
					best, tok, found = k, p.token, true
				}
			}
			return best, tok
		}
		nearest := func(t time.Time, before bool) int64 {
			_, tok := nearestSlot(t, before)
			return tok
		}
		for i := 0; i < len(expected); {
			if published(expected[i]) != nil {
				i++
				continue
			}
			j := i
			for j < len(expected) && published(expected[j]) == nil {
				j++
			}
			run := expected[i:j]
			before, after := nearest(run[0], true), nearest(run[len(run)-1], false)
			takeover := before != 0 && after != 0 && after != before
			// takenAt is when the term that caught the run up was
			// elected: the instant its catch-up plan counts to. Zero when
			// only tokens are known.
			var takenAt time.Time
			if terms != nil {
				// A term began after the run's first slot was due, no
				// later than the term that published the next slot (with
				// once, that slot is often the takeover's catch-up fire).
				// The latest such term planned the catch-up.
				takeover = false
				var latest int64
				for _, t := range terms {
					if t.Start.Before(run[0]) || !t.leads(e.Name) {
						continue
					}
					if (after != 0 && t.Token <= after || after == 0 && !t.Start.After(to)) && (!takeover || t.Token > latest) {
						takeover, latest, takenAt = true, t.Token, t.Start
					}
				}
			}
			// When the entry's next published slot was fired: a slot of the
			// run pending more than StepLateness by then was dropped by a
			// once or skip policy while pending.
			var nextFired time.Time
			if next, tok := nearestSlot(run[len(run)-1], false); tok != 0 && fired != nil {
				nextFired = fired[FiredKey(e.Name, time.Unix(0, next))]
			}
			for n, s := range run {
				ref := SlotRef{Entry: e.Name, Slot: s.UTC()}
				pendingLate := !nextFired.IsZero() && nextFired.Sub(s) > StepLateness
				switch {
				case pendingLate && e.Catchup == config.CatchupOnce:
					ref.Reason = "catchup_once: pending past 30 s"
				case pendingLate && e.Catchup == config.CatchupSkip:
					ref.Reason = "catchup_skip: pending past 30 s"
				case takeover && e.Catchup == config.CatchupOnce:
					ref.Reason = "catchup_once: an older slot of an outage"
				case takeover && e.Catchup == config.CatchupSkip:
					ref.Reason = "catchup_skip"
				case takeover && e.Catchup == config.CatchupAll:
					ref.Reason = catchupAllDrop(e, run, n, takenAt)
				}
				if ref.Reason != "" {
					r.Dropped = append(r.Dropped, ref)
				} else {
					r.Missed = append(r.Missed, ref)
				}
			}
			i = j
		}
	}
	sortRefs(r.Duplicates)
	sortRefs(r.Missed)
	sortRefs(r.Dropped)
	r.OK = len(r.Duplicates) == 0 && len(r.Missed) == 0
	return r
}

// catchupAllDrop is why a takeover under catch-up all dropped run[n], a
// slot of a run of missing ones ("": it did not, so it is missed).
// takenAt is the election of the term that caught up (zero: unknown).
func catchupAllDrop(e *config.Entry, run []time.Time, n int, takenAt time.Time) string {
	s := run[n]
	if takenAt.IsZero() {
		// Tokens alone: the run is all the audit knows of the outage,
		// though the catch-up's fires follow it.
		switch {
		case len(run)-n > int(e.MaxCatchup):
			return "max_catchup"
		case e.CatchupWindow > 0 && run[len(run)-1].Sub(s) > e.CatchupWindow:
			return "catchup_window"
		}
		return ""
	}
	switch {
	case e.CatchupWindow > 0 && !s.After(takenAt.Add(-e.CatchupWindow)):
		return "catchup_window"
	case slotsAfter(e.Schedule, s, takenAt, int(e.MaxCatchup)) >= int(e.MaxCatchup):
		return "max_catchup"
	}
	return ""
}

// slotsAfter counts sched's slots in (s, through], up to limit. Under
// catch-up all a term fires the last max_catchup slots owed up to its
// election (planCatchup): a missed slot with that many after it was
// dropped, whatever the audit saw published after it.
func slotsAfter(sched schedule.Schedule, s, through time.Time, limit int) int {
	n := 0
	for t := sched.Next(s); n < limit && !t.IsZero() && !t.After(through); t = sched.Next(t) {
		n++
	}
	return n
}

func sortRefs(refs []SlotRef) {
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Entry != refs[j].Entry {
			return refs[i].Entry < refs[j].Entry
		}
		return refs[i].Slot.Before(refs[j].Slot)
	})
}

// WriteSummary prints the report for people.
func (r *Report) WriteSummary(w io.Writer) {
	verdict := "PASS"
	if !r.OK {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "drill %s: %d messages audited, %d expected slots in %s .. %s\n", verdict, r.Messages, r.ExpectedSlots,
		r.From.UTC().Format(time.RFC3339), r.To.UTC().Format(time.RFC3339))
	if r.Seed != 0 {
		fmt.Fprintf(w, "  seed: %d (rerun it with --seed %d)\n", r.Seed, r.Seed)
	}
	fmt.Fprintf(w, "  duplicates: %d\n  missed:     %d\n  dropped by catch-up policy: %d\n", len(r.Duplicates), len(r.Missed), len(r.Dropped))
	fmt.Fprintf(w, "  stale publishes rejected by the fence: %d\n  leader changes: %d\n", r.StaleRejected, r.LeaderChanges)
	if r.Shards > 0 {
		fmt.Fprintf(w, "  shards: %d at the end, resized to %v; publishes of a woken replica's fenced terms: %d; stuck shards: %d\n",
			r.Shards, r.Resizes, len(r.WokenPublishes), len(r.StuckShards))
		if r.ShardMoves.Count > 0 {
			fmt.Fprintf(w, "  shard moves: n=%d p50 %.3fs  p99 %.3fs  max %.3fs  (handover to the new leader's scheduling)\n",
				r.ShardMoves.Count, r.ShardMoves.P50, r.ShardMoves.P99, r.ShardMoves.Max)
		}
		for _, s := range r.StuckShards {
			fmt.Fprintf(w, "    stuck: %s\n", s)
		}
		for _, s := range r.Unbalanced {
			fmt.Fprintf(w, "    unbalanced (not a failure): %s\n", s)
		}
	}
	if len(r.Faults) > 0 {
		counts := map[string]int{}
		for _, f := range r.Faults {
			counts[f.Kind]++
		}
		fmt.Fprintf(w, "  faults: %d %v\n", len(r.Faults), counts)
	}
	writeStats(w, "failover gap", "fault to first fire", r.FailoverGaps)
	writeStats(w, "new leader  ", "fault to newer term elected", r.Handovers)
	if r.FireLag.Count > 0 {
		fmt.Fprintf(w, "  fire lag: n=%d p50 %.1fms p99 %.1fms max %.1fms\n", r.FireLag.Count, r.FireLag.P50*1000, r.FireLag.P99*1000, r.FireLag.Max*1000)
	}
	show := func(title string, refs []SlotRef) {
		for i, s := range refs {
			if i == 10 {
				fmt.Fprintf(w, "    ... and %d more\n", len(refs)-10)
				break
			}
			extra := s.Reason
			if s.Count > 1 {
				extra = fmt.Sprintf("x%d", s.Count)
			}
			fmt.Fprintf(w, "    %s %s %s %s\n", title, s.Entry, s.Slot.Format(time.RFC3339Nano), extra)
		}
	}
	show("duplicate", r.Duplicates)
	show("missed", r.Missed)
	show("woken publish", r.WokenPublishes)
	if len(r.DuplicatesInWindow) > 0 || r.Resends > 0 || r.FencedPublishes > 0 {
		fmt.Fprintf(w, "  amqp: duplicates in the documented window %d, re-sends logged %d (all terms, on the leader: %.0f), publishes from a fenced term %d\n",
			len(r.DuplicatesInWindow), r.Resends, r.ResendsAllTerms, r.FencedPublishes)
		show("duplicate (re-send, counted)", r.DuplicatesInWindow)
	}
}

// writeStats prints per-fault-kind duration stats, sorted by kind.
func writeStats(w io.Writer, label, what string, byKind map[string]Stats) {
	for _, k := range slices.Sorted(maps.Keys(byKind)) {
		g := byKind[k]
		fmt.Fprintf(w, "  %s %-13s n=%-3d p50 %.2fs  p99 %.2fs  max %.2fs  (%s)\n", label, k, g.Count, g.P50, g.P99, g.Max, what)
	}
}
