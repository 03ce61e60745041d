package scheduler

import (
	"context"
	"encoding/json"
	"sort"
	"testing"
	"time"

	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/store"
	beatdtest "github.com/beatd/beatd/testkit/testutil"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// TestLateSlotExpires publishes a catch-up through a real Redis and reads
// the messages back: the slots over 30 s late carry the entry's
// late_slot_expires (the earlier of it and the entry's own expires) in
// the expires header and the expiration property; the slot exactly 30 s
// late and the next on-time slot carry only the entry's own expires.
func TestLateSlotExpires(t *testing.T) {
	rs := beatdtest.MustStartRedis(t)
	start := t0.Add(59*time.Minute + 30*time.Second) // 10:59:30
	clock := clockwork.NewFakeClockAt(start)
	pub := redisbroker.New(rs.Client(), redisbroker.Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", Clock: clock})
	cfg := mustConfig(t, `defaults:
  options: {late_slot_expires: 2m}
  catchup: all
  catchup_window: 3m
entries:
  inherits: {task: t, cron: '* * * * *', options: {queue: qa}}
  own-earlier: {task: t, cron: '* * * * *', options: {queue: qb, expires: 60, late_slot_expires: 5m}}
  late-earlier: {task: t, cron: '* * * * *', options: {queue: qc, expires: 1h, late_slot_expires: 5m}}
  none: {task: t, cron: '* * * * *', options: {queue: qd, late_slot_expires: null}}
`)
	st := newMemStore(7)
	for _, e := range cfg.Entries {
		st.states[e.Name] = &store.EntryState{Name: e.Name, LastSlot: t0}
	}
	s, err := New(Config{Dispatcher: pub, Store: st, Clock: clock, Metrics: NewMetrics(prometheus.NewRegistry()),
		Cluster: "beatd/test", Origin: "beatd@test"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, Term{Fence: election.Fence{Token: 7, Key: "/leader"}}) }()
	t.Cleanup(func() { cancel(); <-done })

	type msg struct{ expires, expiration string }
	read := func(queue string) map[string]msg {
		raw, err := rs.Client().LRange(context.Background(), queue, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]msg{}
		for _, r := range raw {
			var m struct {
				Headers struct {
					Expires *string `json:"expires"`
					Slot    string  `json:"beat_slot"`
				} `json:"headers"`
				Properties struct {
					Expiration string `json:"expiration"`
				} `json:"properties"`
			}
			if err := json.Unmarshal([]byte(r), &m); err != nil {
				t.Fatal(err)
			}
			e := "null"
			if m.Headers.Expires != nil {
				e = *m.Headers.Expires
			}
			out[m.Headers.Slot[11:16]] = msg{e, m.Properties.Expiration}
		}
		return out
	}
	queues := []string{"qa", "qb", "qc", "qd"}
	count := func(n int) func() bool {
		return func() bool {
			for _, q := range queues {
				if l, _ := rs.Client().LLen(context.Background(), q).Result(); l < int64(n) {
					return false
				}
			}
			return true
		}
	}
	// The catch-up: 10:57 and 10:58 are late, 10:59 is 30 s late (not over).
	beatdtest.Eventually(t, 10*time.Second, "the catch-up", count(3))
	beatdtest.Eventually(t, 10*time.Second, "the loop to wait for 11:00", func() bool {
		return clock.BlockUntilContext(ctx, 1) == nil
	})
	clock.Advance(30 * time.Second) // 11:00:00, on time
	beatdtest.Eventually(t, 10*time.Second, "the 11:00 slot", count(4))

	at := func(d time.Duration) string { return start.Add(d).UTC().Format("2006-01-02T15:04:05+00:00") }
	onTime := func(d time.Duration) string { return t0.Add(time.Hour + d).UTC().Format("2006-01-02T15:04:05+00:00") }
	tests := []struct {
		queue string
		want  map[string]msg // by slot HH:MM
	}{
		{"qa", map[string]msg{"10:57": {at(2 * time.Minute), "120000"}, "10:58": {at(2 * time.Minute), "120000"},
			"10:59": {"null", ""}, "11:00": {"null", ""}}},
		{"qb", map[string]msg{"10:57": {at(time.Minute), "60000"}, "10:58": {at(time.Minute), "60000"},
			"10:59": {at(time.Minute), "60000"}, "11:00": {onTime(time.Minute), "60000"}}},
		{"qc", map[string]msg{"10:57": {at(5 * time.Minute), "300000"}, "10:58": {at(5 * time.Minute), "300000"},
			"10:59": {at(time.Hour), "3600000"}, "11:00": {onTime(time.Hour), "3600000"}}},
		{"qd", map[string]msg{"10:57": {"null", ""}, "10:58": {"null", ""}, "10:59": {"null", ""}, "11:00": {"null", ""}}},
	}
	for _, tt := range tests {
		got := read(tt.queue)
		var slots []string
		for k := range got {
			slots = append(slots, k)
		}
		sort.Strings(slots)
		if len(got) != len(tt.want) {
			t.Errorf("%s: slots %v, want 10:57-11:00", tt.queue, slots)
		}
		for slot, w := range tt.want {
			if g := got[slot]; g != w {
				t.Errorf("%s slot %s: expires %s expiration %q, want %s %q", tt.queue, slot, g.expires, g.expiration, w.expires, w.expiration)
			}
		}
	}
}
