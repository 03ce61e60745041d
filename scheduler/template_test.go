package scheduler

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	redisbroker "github.com/beatd/beatd/broker/redis"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/store"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/prometheus/client_golang/prometheus"
)

// TestTemplatedArgsAreTheSlot: a templated crontab entry, published by a
// catch-up and again by a backfill through real Redis and etcd, renders
// each slot's own time into its arguments (never the publish time, an
// hour or more later), in the entry's zone; the backfill's message for a
// slot the catch-up published has the same body, byte for byte.
func TestTemplatedArgsAreTheSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis and etcd")
	}
	rs := testutil.MustStartRedis(t)
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	ctx := context.Background()
	leader, err := cli.Put(ctx, "/beatd/tmpl/leader/x", "x")
	if err != nil {
		t.Fatal(err)
	}
	fence := election.Fence{Token: leader.Header.Revision, Key: "/beatd/tmpl/leader/x"}
	st := store.New(cli, "/beatd/tmpl/")
	pub := redisbroker.New(rs.Client(), redisbroker.Options{Cluster: "beatd/tmpl", KeyPrefix: "beatd:{tmpl}:"})

	// start_at an hour ago, catchup all: a new entry's catch-up
	// publishes the past hour's twelve slots at once.
	start := time.Now().Add(-time.Hour).Truncate(5 * time.Minute)
	cfg := mustConfig(t, fmt.Sprintf(`entries:
  report:
    task: tasks.report
    timezone: Asia/Kolkata
    crontab: {minute: "*/5"}
    start_at: %s
    catchup: all
    catchup_window: 2h
    args: ["{{ slot }}", "{{ slot.epoch }}", "{{ prev_slot }}"]
    kwargs: {period: "{{ prev_slot.date }}/{{ slot.date }}", entry: "{{ name }}", attempt: "{{ attempt }}"}
`, start.UTC().Format(time.RFC3339)))
	s, err := New(Config{Dispatcher: pub, Store: st, Metrics: NewMetrics(prometheus.NewRegistry()),
		Cluster: "beatd/tmpl", Origin: "beatd@tmpl"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx, Term{Fence: fence}) }()
	defer func() { cancel(); <-done }()

	type msg struct {
		slot time.Time
		body []byte
		args []any
		kw   map[string]any
	}
	read := func() []msg {
		raw, err := rs.Client().LRange(ctx, "celery", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []msg
		for _, r := range raw {
			var env struct {
				Body    string
				Headers struct {
					BeatSlot string `json:"beat_slot"`
				}
			}
			if err := json.Unmarshal([]byte(r), &env); err != nil {
				t.Fatal(err)
			}
			var m msg
			m.body, _ = base64.StdEncoding.DecodeString(env.Body)
			m.slot, _ = time.Parse(time.RFC3339Nano, env.Headers.BeatSlot)
			var b []json.RawMessage
			d := json.NewDecoder(strings.NewReader(string(m.body)))
			d.UseNumber()
			if err := d.Decode(&b); err != nil || len(b) != 3 {
				t.Fatalf("body %s: %v", m.body, err)
			}
			for i, dst := range []any{&m.args, &m.kw} {
				d := json.NewDecoder(strings.NewReader(string(b[i])))
				d.UseNumber() // an epoch prints as it was sent
				_ = d.Decode(dst)
			}
			out = append(out, m)
		}
		return out
	}
	testutil.Eventually(t, 10*time.Second, "the catch-up's 12 slots", func() bool { return len(read()) >= 12 })

	// A backfill of the first half hour again, those slots included.
	now := time.Now()
	job := &store.Backfill{Entry: "report", From: start, To: start.Add(30 * time.Minute), Rate: 1000, IncludeFired: true}
	if err := st.CreateBackfill(ctx, job, nil, now); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the backfill's 7 slots", func() bool { return len(read()) >= 19 })

	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	bodies := map[time.Time][]byte{}
	late, again := 0, 0
	for _, m := range read() {
		slot := m.slot.In(kolkata)
		prev := slot.Add(-5 * time.Minute)
		want := fmt.Sprintf("[%s %d %s]", slot.Format(time.RFC3339), slot.Unix(), prev.Format(time.RFC3339))
		if got := fmt.Sprint(m.args); got != want {
			t.Errorf("slot %s: args %s, want %s", m.slot, got, want)
		}
		if got, want := fmt.Sprint(m.kw), fmt.Sprintf("map[attempt:1 entry:report period:%s/%s]", prev.Format(time.DateOnly), slot.Format(time.DateOnly)); got != want {
			t.Errorf("slot %s: kwargs %s, want %s", m.slot, got, want)
		}
		if now.Sub(m.slot) >= 30*time.Minute {
			late++ // published half an hour or more after its slot
		}
		if b, ok := bodies[m.slot]; ok {
			again++
			if string(b) != string(m.body) {
				t.Errorf("slot %s: the backfill's body differs from the catch-up's\n%s\n%s", m.slot, b, m.body)
			}
		}
		bodies[m.slot] = m.body
	}
	if late < 6 || again != 7 {
		t.Errorf("%d messages of slots half an hour old or more, %d slots published twice; want 6+ and 7", late, again)
	}
	if len(bodies) < 12 {
		t.Errorf("%d distinct slots, want the catch-up's 12 at least", len(bodies))
	}
}
