package outcome

import (
	"encoding/json"
	"testing"
	"time"
)

// TestRunJSON: the API's recent runs keep the broker's run record's JSON
// (slot, published_at, token, task_id, manual, backfill) whatever the
// state's outcome fields hold.
func TestRunJSON(t *testing.T) {
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		run  Run
		want string
	}{
		{"scheduled", Run{Slot: at, PublishedAt: at.Add(time.Millisecond), Token: 7, TaskID: "t1"},
			`{"slot":"2026-12-05T10:00:00Z","published_at":"2026-12-05T10:00:00.001Z","token":7,"task_id":"t1"}`},
		{"manual backfill", Run{Slot: at, PublishedAt: at, Token: 7, TaskID: "t2", Manual: true, Backfill: true},
			`{"slot":"2026-12-05T10:00:00Z","published_at":"2026-12-05T10:00:00Z","token":7,"task_id":"t2","manual":true,"backfill":true}`},
		{"with outcome", Run{Slot: at, PublishedAt: at, TaskID: "t3", Kind: Failed, Updated: at, Started: at, Runtime: time.Second,
			Worker: "celery@w", ExcType: "E", ExcMsg: "m", Skips: 2},
			`{"slot":"2026-12-05T10:00:00Z","published_at":"2026-12-05T10:00:00Z","token":0,"task_id":"t3"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.run)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got  %s\nwant %s", b, tc.want)
			}
		})
	}
}

// TestApplyChain: a run with a chain is the whole chain. Each case feeds
// reports (step, kind) in order, as they may arrive, and checks where
// the run ends up and which reports moved it.
func TestApplyChain(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	type rep struct {
		step int
		kind Kind
	}
	for _, tc := range []struct {
		name      string
		chain     uint8
		reports   []rep
		wantKind  Kind
		wantStep  uint8
		wantMoved []bool
		wantEnded int // index of the report that ended it; -1: none
	}{
		{"plain run ends with its task", 0,
			[]rep{{0, Received}, {0, Started}, {0, Succeeded}},
			Succeeded, 0, []bool{true, true, true}, 2},
		{"head success is not the run's", 2,
			[]rep{{0, Started}, {0, Succeeded}},
			Published, 1, []bool{true, true}, -1},
		{"the last step's success ends it", 2,
			[]rep{{0, Started}, {0, Succeeded}, {1, Started}, {1, Succeeded}, {2, Received}, {2, Started}, {2, Succeeded}},
			Succeeded, 2, []bool{true, true, true, true, true, true, true}, 6},
		{"step 2 fails: the run fails there", 2,
			[]rep{{0, Started}, {0, Succeeded}, {1, Started}, {1, Failed}},
			Failed, 1, []bool{true, true, true, true}, 3},
		{"the backend's failures of later steps come after: ignored", 2,
			[]rep{{0, Succeeded}, {1, Failed}, {2, Failed}},
			Failed, 1, []bool{true, true, false}, 1},
		{"a later step's report supersedes an earlier one's, late", 2,
			[]rep{{0, Received}, {1, Started}, {0, Started}, {0, Succeeded}},
			Started, 1, []bool{true, true, false, false}, -1},
		{"the next step's received before the previous step's success", 1,
			[]rep{{0, Started}, {1, Received}, {0, Succeeded}, {1, Succeeded}},
			Succeeded, 1, []bool{true, true, false, true}, 3},
		{"a step retried stays in progress", 2,
			[]rep{{0, Succeeded}, {1, Started}, {1, Retried}, {1, Received}, {1, Started}, {1, Succeeded}},
			Published, 2, []bool{true, true, true, true, true, true}, -1},
		{"a revoked step ends the run revoked", 2,
			[]rep{{0, Succeeded}, {1, Revoked}, {2, Succeeded}},
			Revoked, 1, []bool{true, true, false}, 1},
		{"an expired last step", 1,
			[]rep{{0, Succeeded}, {1, Expired}},
			Expired, 1, []bool{true, true}, 1},
		{"a step past the chain is not the run's", 1,
			[]rep{{2, Failed}},
			Published, 0, []bool{false}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Run{Kind: Published, Chain: tc.chain}
			ended := -1
			for i, rp := range tc.reports {
				ev := Event{Kind: rp.kind, Worker: "celery@w", Runtime: time.Second}
				if rp.kind == Failed {
					ev.ExcType, ev.ExcMessage = "ValueError", "step failed"
				}
				moved, end := r.Apply(rp.step, ev, t0.Add(time.Duration(i)*time.Second))
				if moved != tc.wantMoved[i] {
					t.Errorf("report %d %v: moved %v, want %v", i, rp, moved, tc.wantMoved[i])
				}
				if end {
					if ended >= 0 {
						t.Errorf("report %d ended it again", i)
					}
					ended = i
				}
			}
			if r.Kind != tc.wantKind || r.Step != tc.wantStep || ended != tc.wantEnded {
				t.Errorf("run at %v step %d, ended by %d; want %v step %d, ended by %d", r.Kind, r.Step, ended, tc.wantKind, tc.wantStep, tc.wantEnded)
			}
			if r.Kind == Failed && (r.ExcType != "ValueError" || r.ExcMsg != "step failed") {
				t.Errorf("failed without the step's exception: %q %q", r.ExcType, r.ExcMsg)
			}
		})
	}
}

// TestApplyChainTimes: a chained run's start is its task's and its
// runtime the span to its last step's end; a plain run's runtime is its
// task's own.
func TestApplyChainTimes(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	chain := Run{Kind: Published, Chain: 1}
	chain.Apply(0, Event{Kind: Started}, at(1))
	chain.Apply(0, Event{Kind: Succeeded, Runtime: 2 * time.Second}, at(3))
	chain.Apply(1, Event{Kind: Started}, at(4))
	chain.Apply(1, Event{Kind: Succeeded, Runtime: 3 * time.Second, Worker: "celery@b"}, at(7))
	if !chain.Started.Equal(at(1)) || chain.Runtime != 6*time.Second || !chain.Updated.Equal(at(7)) || chain.Worker != "celery@b" {
		t.Errorf("chain: started %v runtime %v updated %v worker %q", chain.Started, chain.Runtime, chain.Updated, chain.Worker)
	}
	plain := Run{Kind: Published}
	plain.Apply(0, Event{Kind: Started}, at(1))
	plain.Apply(0, Event{Kind: Succeeded, Runtime: 2 * time.Second}, at(3))
	if !plain.Started.Equal(at(1)) || plain.Runtime != 2*time.Second {
		t.Errorf("plain: started %v runtime %v", plain.Started, plain.Runtime)
	}
}
