package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/store"
)

// apiCLI runs the beatd CLI against replica r's HTTP API with the named
// token: "tok-NAME" of the test's tokens file, or for admin the replicas'
// admin token.
func (c *cluster) apiCLI(r *replica, token string, args ...string) (int, string, string) {
	c.t.Helper()
	tf := filepath.Join(c.dir, "tok-"+token)
	secret := "tok-" + token
	if token == "admin" {
		secret = "test-token"
	}
	if err := os.WriteFile(tf, []byte(secret), 0o600); err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(beatdBin, append(args, "--server", r.URL(""), "--token-file", tf)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	code := 0
	if err := cmd.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			c.t.Fatalf("beatd %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return code, out.String(), errb.String()
}

// writeTokens writes a tokens file of name → role, each token being
// "tok-NAME".
func writeTokens(t *testing.T, dir string, roles map[string]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("tokens:\n")
	for name, role := range roles {
		b.WriteString("  " + name + ": {role: " + role + ", sha256: " + auth.Hash("tok-"+name) + "}\n")
	}
	p := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProcessBackfill runs backfills end to end against real etcd and
// Redis: a dry run, bad ranges, the roles, a kill -9 of the leader in the
// middle (the new leader finishes it: every slot once, with the task id a
// normal fire would have had), a repeat that publishes nothing, a cancel,
// and the audit trail after the failover.
func TestProcessBackfill(t *testing.T) {
	// Its own servers and no timing bound: it runs beside the waiting tests.
	t.Parallel()
	dir := t.TempDir()
	tokens := writeTokens(t, dir, map[string]string{"ops": "operate", "reader": "read"})
	c := newCluster(t, "entries:\n  bf: {task: tasks.add, cron: '* * * * *', args: [1, 2], options: {queue: bf}}\n"+
		"  fast: {task: tasks.add, every: 1s, options: {queue: fast}}\n", 2, "--tokens-file", tokens, "--require-notes")
	lead, _ := c.leader("", 20*time.Second)
	var other *replica
	for _, r := range c.replicas {
		if r != lead {
			other = r
		}
	}
	// Two hours of minutes, ending a minute ago: 120 slots.
	to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	from := to.Add(-119 * time.Minute)
	rng := []string{"--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339)}
	var want []string
	for s := from; !s.After(to); s = s.Add(time.Minute) {
		id := celery.SlotIDOf(keys.Cluster(c.prefix), "bf", s)
		want = append(want, string(id[:]))
	}

	// Refusals: the read role, a range in the future, reversed, too wide.
	if code, _, errs := c.apiCLI(other, "reader", append([]string{"backfill", "bf", "--dry-run"}, rng...)...); code != 1 || !strings.Contains(errs, `"reader" has the read role; this needs operate`) {
		t.Errorf("backfill as reader: exit %d: %s", code, errs)
	}
	for _, tt := range []struct{ name, from, to, want string }{
		{"future", "-1h", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "/to: to (" /* ... */},
		{"reversed", to.Format(time.RFC3339), from.Format(time.RFC3339), "must be after from"},
		{"too wide", "-30d", "now", "more than 10000 slots"},
	} {
		code, _, errs := c.apiCLI(other, "ops", "backfill", "bf", "--dry-run", "--from", tt.from, "--to", tt.to)
		if code != 1 || !strings.Contains(errs, tt.want) {
			t.Errorf("%s range: exit %d: %s", tt.name, code, errs)
		}
	}
	if code, _, errs := c.apiCLI(other, "ops", "backfill", "nope", "--from", "-1h", "--to", "now"); code != 1 || !strings.Contains(errs, "404") {
		t.Errorf("backfill of an unknown entry: exit %d: %s", code, errs)
	}

	// The dry run lists every slot with its task id, none fired.
	code, out, errs := c.apiCLI(other, "ops", append([]string{"backfill", "bf", "--dry-run", "--json"}, rng...)...)
	if code != 0 {
		t.Fatalf("dry run: exit %d: %s", code, errs)
	}
	var plan api.BackfillAnswer
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	if len(plan.Slots) != 120 || plan.Publish != 120 || plan.Fired != 0 {
		t.Fatalf("dry run: %d slots, %d to publish, %d fired", len(plan.Slots), plan.Publish, plan.Fired)
	}
	for i, s := range plan.Slots {
		if s.TaskID != want[i] || !s.Slot.Equal(from.Add(time.Duration(i)*time.Minute)) {
			t.Fatalf("slot %d: %+v, want %s", i, s, want[i])
		}
	}
	for _, m := range c.audit("bf") {
		if !m.Slot.After(to) {
			t.Fatalf("a dry run published %+v", m)
		}
	}

	// The backfill, killed mid-way: the new leader finishes it.
	code, out, errs = c.apiCLI(other, "ops", append([]string{"backfill", "bf", "--rate", "20", "--note", "outage 2026-11-30", "--json"}, rng...)...)
	if code != 0 {
		t.Fatalf("backfill: exit %d: %s", code, errs)
	}
	var ans api.BackfillAnswer
	if err := json.Unmarshal([]byte(out), &ans); err != nil || ans.Job == nil {
		t.Fatalf("backfill answer %v: %s", err, out)
	}
	id := ans.Job.ID
	job := func() store.Backfill {
		t.Helper()
		_, out, _ := c.apiCLI(other, "reader", "backfill", "--list", "bf", "--json")
		var l struct{ Backfills []store.Backfill }
		_ = json.Unmarshal([]byte(out), &l)
		for _, j := range l.Backfills {
			if j.ID == id {
				return j
			}
		}
		return store.Backfill{}
	}
	waitFor(t, 20*time.Second, "the backfill under way", func() bool {
		j := job()
		return j.State == store.BackfillRunning && j.Published >= 30
	})
	if _, out, _ := c.cli("status"); !strings.Contains(out, "backfill "+id+" of bf: running, ") {
		t.Errorf("status does not show the running backfill:\n%s", out)
	}
	lead.Signal(syscall.SIGKILL)
	<-lead.Done()
	c.leader(lead.ID, 10*time.Second)
	waitFor(t, 30*time.Second, "the new leader to finish the backfill", func() bool { return job().State == store.BackfillDone })
	j := job()
	// The queue also holds the entry's own fires, of slots after to.
	inRange := func() []string {
		var ids []string
		for _, m := range c.audit("bf") {
			if !m.Slot.After(to) {
				ids = append(ids, m.TaskID)
			}
		}
		return ids
	}
	msgs := inRange()
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m]++
	}
	for _, w := range want {
		if seen[w] != 1 {
			t.Errorf("task %s published %d times", w, seen[w])
		}
	}
	if len(msgs) != 120 || j.Published != 120 || j.Skipped != 0 || j.Total != 120 {
		t.Errorf("%d messages; job %+v", len(msgs), j)
	}
	if j.Actor != "ops" || j.Note != "outage 2026-11-30" {
		t.Errorf("job %+v: want actor ops and its note", j)
	}

	// The same range again: every slot is fired, and nothing new goes out.
	code, out, errs = c.apiCLI(other, "ops", append([]string{"backfill", "bf", "--dry-run"}, rng...)...)
	if code != 0 || !strings.Contains(out, "dry run: 120 slots, 0 would be published, 120 already fired") {
		t.Errorf("repeat dry run: exit %d: %s %s", code, out, errs)
	}
	if code, _, errs = c.apiCLI(other, "ops", append([]string{"backfill", "bf", "--wait", "20s"}, rng...)...); code != 0 {
		t.Errorf("repeat: exit %d: %s", code, errs)
	}
	if n := len(inRange()); n != 120 {
		t.Errorf("a repeated backfill published: %d messages, want 120", n)
	}

	// A slow backfill, cancelled: it ends with what it did.
	earlier := []string{"--from", from.Add(-6 * time.Hour).Format(time.RFC3339), "--to", from.Add(-time.Minute).Format(time.RFC3339)}
	code, out, errs = c.apiCLI(other, "ops", append([]string{"backfill", "bf", "--rate", "2", "--json"}, earlier...)...)
	if code != 0 || json.Unmarshal([]byte(out), &ans) != nil {
		t.Fatalf("slow backfill: exit %d: %s %s", code, out, errs)
	}
	id = ans.Job.ID
	waitFor(t, 10*time.Second, "the slow backfill under way", func() bool { return job().Published >= 2 })
	if code, _, errs := c.apiCLI(other, "ops", "backfill", "--cancel", id, "--note", "wrong range"); code != 0 {
		t.Fatalf("cancel: exit %d: %s", code, errs)
	}
	waitFor(t, 10*time.Second, "the cancel", func() bool { return job().State == store.BackfillCancelled })
	if j := job(); j.Published >= 360 || !strings.Contains(j.Error, "cancelled by ops: wrong range") {
		t.Errorf("cancelled job %+v", j)
	}
	if code, _, errs := c.apiCLI(other, "ops", "backfill", "--cancel", id); code != 1 || !strings.Contains(errs, "409") {
		t.Errorf("cancel of a cancelled backfill: exit %d: %s", code, errs)
	}

	// --require-notes: a pause without a note is refused, by the CLI and
	// by the API; with one, status shows it.
	if code, _, errs := c.cli("pause", "fast"); code != 2 || !strings.Contains(errs, "--require-notes") {
		t.Errorf("pause without a note: exit %d: %s", code, errs)
	}
	if code, _, errs := c.apiCLI(other, "ops", "pause", "fast"); code != 1 || !strings.Contains(errs, "/note") {
		t.Errorf("pause without a note over the API: exit %d: %s", code, errs)
	}
	if code, _, errs := c.apiCLI(other, "reader", "pause", "fast", "--note", "x"); code != 1 || !strings.Contains(errs, "403") {
		t.Errorf("pause as reader: exit %d: %s", code, errs)
	}
	if code, _, errs := c.apiCLI(other, "ops", "pause", "fast", "--note", "vendor API down"); code != 0 {
		t.Errorf("pause: exit %d: %s", code, errs)
	}
	waitFor(t, 10*time.Second, "status to show the pause's note", func() bool {
		_, out, _ := c.cli("status", "fast")
		return strings.Contains(out, "paused by ops at ") && strings.Contains(out, "vendor API down")
	})

	// The audit trail, written through two leaders, survives the failover.
	code, out, errs = c.cli("audit", "--json")
	if code != 0 {
		t.Fatalf("audit: exit %d: %s", code, errs)
	}
	var trail struct{ Records []store.AuditRecord }
	if err := json.Unmarshal([]byte(out), &trail); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range trail.Records {
		got = append(got, r.Actor+" "+r.Via+" "+r.Action+" "+r.Entry+" "+r.Note)
	}
	for _, w := range []string{
		"ops cli backfill bf outage 2026-11-30",
		"ops cli backfill-cancel bf wrong range",
		"ops cli pause fast vendor API down",
	} {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("audit lacks %q: %q", w, got)
		}
	}
	if code, out, _ := c.cli("audit", "fast"); code != 0 || !strings.Contains(out, "vendor API down") || strings.Contains(out, "outage") {
		t.Errorf("audit fast: exit %d\n%s", code, out)
	}
}
