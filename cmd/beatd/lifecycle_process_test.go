package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
)

// TestProcessLifecycleFailover: max_runs and end_at hold across a kill -9
// of the leader. The new leader counts the runs its predecessor made, so
// the entry runs exactly max_runs times; nothing fires after end_at; and
// both then show as finished, not as errors.
func TestProcessLifecycleFailover(t *testing.T) {
	// Its own etcd and Redis; it judges which slots were published, not
	// how fast.
	t.Parallel()
	end := time.Now().Add(6 * time.Second).UTC().Truncate(time.Second)
	cfg := fmt.Sprintf(`entries:
  limited: {task: tasks.add, every: 1s, max_runs: 5, catchup: all, options: {queue: limited}}
  ending: {task: tasks.add, every: 1s, end_at: %q, catchup: all, options: {queue: ending}}
`, end.Format(time.RFC3339))
	c := newCluster(t, cfg, 2)
	lead, _ := c.leader("", 20*time.Second)
	waitFor(t, 10*time.Second, "two runs of limited", func() bool { return len(c.audit("limited")) >= 2 })
	lead.Signal(syscall.SIGKILL)
	<-lead.Done()
	c.leader(lead.ID, 10*time.Second)
	waitFor(t, 20*time.Second, "ending's end_at to pass", func() bool { return time.Now().After(end.Add(2 * time.Second)) })
	time.Sleep(2 * time.Second) // room for a run too many to show

	slots := map[time.Time]int{}
	for _, m := range c.audit("limited") {
		slots[m.Slot]++
	}
	if len(slots) != 5 {
		t.Errorf("limited ran %d slots across the failover, want max_runs 5: %v", len(slots), slots)
	}
	for s, n := range slots {
		if n != 1 {
			t.Errorf("limited slot %s published %d times", s, n)
		}
	}
	ending := c.audit("ending")
	if len(ending) == 0 {
		t.Error("ending never ran")
	}
	for _, m := range ending {
		if m.Slot.After(end) {
			t.Errorf("ending fired %s, after its end_at %s", m.Slot, end)
		}
	}
	code, out, errs := c.cli("status", "-o", "json")
	var st api.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status: exit %d %s", code, errs)
	}
	for _, e := range st.Entries {
		switch e.Name {
		case "limited":
			if !e.Finished || e.RemainingRuns == nil || *e.RemainingRuns != 0 || e.NextRunAt != nil {
				t.Errorf("limited: finished %v remaining %v next %v", e.Finished, e.RemainingRuns, e.NextRunAt)
			}
		case "ending":
			if !e.Finished || e.NextRunAt != nil || e.LastError != "" {
				t.Errorf("ending: finished %v next %v error %q", e.Finished, e.NextRunAt, e.LastError)
			}
		}
	}
	if code, out, _ := c.cli("next", "--config", c.config, "--entry", "limited"); code != 0 || !strings.Contains(out, "made its max_runs (5)") {
		t.Errorf("next limited: exit %d\n%s", code, out)
	}
}
