package livetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// record is one run of tasks.record or tasks.record_error, as the task
// itself wrote it.
type record struct {
	Task     string `json:"task"`
	ID       string `json:"id"`
	RootID   string `json:"root_id"`
	ParentID string `json:"parent_id"`
	Args     []any  `json:"args"`
	BeatSlot string `json:"beat_slot"`
}

func records(t *testing.T, rs *testutil.Redis, list string) []record {
	t.Helper()
	raw, err := rs.Client().LRange(context.Background(), list, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]record, len(raw))
	for i, r := range raw {
		d := json.NewDecoder(strings.NewReader(r))
		d.UseNumber() // an epoch prints as the task got it
		if err := d.Decode(&out[i]); err != nil {
			t.Fatalf("%v: %s", err, r)
		}
	}
	return out
}

// TestPeriodicChainOnACeleryWorker: beatd runs a periodic chain of three
// tasks with a link_error on an unmodified Celery worker. For each slot
// the tasks' own records show the order fetch, transform, notify (which
// fails), then the error callback; each step got its own arguments, the
// second and third the previous step's result first; the first step's
// templated argument is its slot (the beat_slot header), and each step's
// task id is the one beatd derived. A link on another entry runs with its
// task's result.
func TestPeriodicChainOnACeleryWorker(t *testing.T) {
	rs := testutil.MustStartRedis(t)
	etcd := testutil.MustStartEmbeddedEtcd(t)
	testutil.MustStartCeleryWorker(t, rs, "celery,steps")
	cfg := writeFile(t, t.TempDir(), "schedules.yaml", `entries:
  etl:
    task: tasks.record
    every: 2s
    args: [fetch, "{{ slot.epoch }}"]
    kwargs: {log: canvas}
    chain:
      - {task: tasks.record, args: [transform], kwargs: {log: canvas}, options: {queue: steps}}
      - {task: tasks.record, args: [notify], kwargs: {log: canvas, fail: true}}
    link_error: {task: tasks.record_error, kwargs: {log: canvas}}
  linked:
    task: tasks.add
    every: 2s
    args: [2, 3]
    link: {task: tasks.record, kwargs: {log: linked}}
`)
	startBeatd(t, nil, "--config", cfg, "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--prefix", "/beatd/canvas/",
		"--broker", rs.URL(0), "--lease-ttl", "2s", "--id", "c1")

	// A slot is complete when its four records are in.
	complete := func() map[string][]record {
		bySlot := map[string][]record{}
		for _, r := range records(t, rs, "canvas") {
			bySlot[r.RootID] = append(bySlot[r.RootID], r)
		}
		for root, rs := range bySlot {
			if len(rs) < 4 {
				delete(bySlot, root)
			}
		}
		return bySlot
	}
	waitFor(t, 60*time.Second, "two slots of the chain run through", func() bool { return len(complete()) >= 2 })
	for root, recs := range complete() {
		if len(recs) != 4 {
			t.Errorf("slot %s: %d records, want 4: %+v", root, len(recs), recs)
			continue
		}
		var id [36]byte
		copy(id[:], root)
		s1, s2 := celery.StepID(id, 1), celery.StepID(id, 2)
		fetch, transform, notify, failed := recs[0], recs[1], recs[2], recs[3]
		slot, err := time.Parse(time.RFC3339Nano, fetch.BeatSlot)
		if err != nil {
			t.Errorf("slot %s: the first step has no beat_slot header (%v): %+v", root, err, fetch)
			continue
		}
		epoch := strconv.FormatInt(slot.Unix(), 10)
		for _, c := range []struct {
			r                record
			task, id, parent string
			args             string
		}{
			{fetch, "record", root, "", "[fetch " + epoch + "]"},
			{transform, "record", string(s1[:]), root, "[fetch+" + epoch + " transform]"},
			{notify, "record", string(s2[:]), string(s1[:]), "[fetch+" + epoch + "+transform notify]"},
			{failed, "record_error", "", "", "[" + string(s2[:]) + "]"},
		} {
			if got := fmt.Sprint(c.r.Args); c.r.Task != c.task || got != c.args || (c.id != "" && c.r.ID != c.id) || c.r.ParentID != c.parent {
				t.Errorf("slot %s: got %s id %s parent %s args %s\n want %s id %s parent %s args %s",
					fetch.BeatSlot, c.r.Task, c.r.ID, c.r.ParentID, got, c.task, c.id, c.parent, c.args)
			}
		}
	}
	waitFor(t, 30*time.Second, "the link ran", func() bool { return len(records(t, rs, "linked")) > 0 })
	for _, r := range records(t, rs, "linked") {
		if fmt.Sprint(r.Args) != "[5]" || r.ParentID != r.RootID {
			t.Errorf("link: %+v, want args [5] with the linked task as parent", r)
		}
	}
}
