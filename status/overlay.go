package status

import "time"

// Live is what the leader's loop remembers of an entry's last publish,
// which etcd does not hold: its result (a ResultWords word before
// "(manual)": ok, duplicate, stale, error, manual, backfill) and error,
// its health, and the leader's own next fire. The daemon takes it from
// its scheduler, `beatd status` from the leader's /status (LiveOf) and
// the console from the leader's fire timeline (FireAt, Manual).
//
// A shard's leader sends its entries' records to the other replicas
// (GET /status/live, LiveAnswer), hence the JSON names.
type Live struct {
	Result      string    `json:"result,omitempty"`
	Error       string    `json:"error,omitempty"`
	ErrorAt     time.Time `json:"error_at,omitzero"`
	PublishedAt time.Time `json:"published_at,omitzero"`
	// NextFireAt is the oldest slot the leader has not yet published,
	// else its next one; zero when it does not say.
	NextFireAt   time.Time `json:"next_fire_at,omitzero"`
	Health       string    `json:"health,omitempty"`
	HealthReason string    `json:"health_reason,omitempty"`
	// FireAt is when the newest fire's result came (zero: not known),
	// Manual that it was a trigger's.
	FireAt time.Time `json:"fire_at,omitzero"`
	Manual bool      `json:"manual,omitempty"`
}

// Overlay is the one place the leader's live results meet what etcd and
// the broker say: each entry of v with a Live record takes its last
// result, error, health and (when one is due) next fire from it, and its
// newest fire when the record's is newer.
func (v *View) Overlay(live map[string]Live) {
	for i := range v.Entries {
		if l, ok := live[v.Entries[i].Name]; ok {
			v.Entries[i].Overlay(l)
		}
	}
}

// Overlay applies one entry's Live record (View.Overlay).
func (e *Entry) Overlay(l Live) {
	e.LastResult, e.LastError = l.Result, l.Error
	e.Health, e.HealthReason = l.Health, l.HealthReason
	e.LastErrorAt, e.LastPublishedAt = timePtr(l.ErrorAt), timePtr(l.PublishedAt)
	if !l.NextFireAt.IsZero() && e.NextRunAt != nil {
		e.NextRunAt = timePtr(l.NextFireAt)
	}
	if !l.FireAt.IsZero() && !l.FireAt.Before(e.LastFire.At) {
		e.LastFire = Fire{At: l.FireAt, Result: ResultWords(l.Result, l.Manual)}
	}
}

// LiveOf reads the Live records back out of another replica's view (the
// leader's /status), by name.
func LiveOf(entries []Entry) map[string]Live {
	out := make(map[string]Live, len(entries))
	for _, e := range entries {
		out[e.Name] = Live{Result: e.LastResult, Error: e.LastError, ErrorAt: timeOf(e.LastErrorAt), PublishedAt: timeOf(e.LastPublishedAt),
			NextFireAt: timeOf(e.NextRunAt), Health: e.Health, HealthReason: e.HealthReason}
	}
	return out
}

// OverlayRuns takes each entry's run history (recent runs, run count,
// last run) from entries that have one: the leader's /status, read by a
// CLI that does not reach the broker itself.
func (v *View) OverlayRuns(entries []Entry) {
	byName := make(map[string]*Entry, len(entries))
	for i := range entries {
		byName[entries[i].Name] = &entries[i]
	}
	for i := range v.Entries {
		e := &v.Entries[i]
		if r := byName[e.Name]; r != nil && r.RecentRuns != nil {
			e.RecentRuns, e.TotalRunCount, e.LastRunAt = r.RecentRuns, r.TotalRunCount, r.LastRunAt
			if f := fireOf(r.RecentRuns); f.At.After(e.LastFire.At) {
				e.LastFire = f
			}
		}
	}
}

func timeOf(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
