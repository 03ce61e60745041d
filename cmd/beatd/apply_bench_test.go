package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	benchApply  = flag.Bool("bench-apply", false, "run TestBenchApply")
	applyCount  = flag.Int("apply-entries", 100000, "TestBenchApply: entries in the file")
	applyBudget = flag.Duration("apply-budget", time.Minute, "TestBenchApply: the most the apply may take")
)

// TestBenchApply times `beatd entries apply` of a large file (100,000
// entries by default) against one replica with its embedded etcd, and
// checks that every entry then runs. Opt-in: make bench-apply.
func TestBenchApply(t *testing.T) {
	if !*benchApply {
		t.Skip("the apply benchmark is opt-in: make bench-apply (or go test ./cmd/beatd -run TestBenchApply -args -bench-apply)")
	}
	c := newCluster(t, "entries:\n  seed: {task: tasks.add, every: 1h}\n", 1)
	lead, _ := c.leader("", 20*time.Second)
	var b strings.Builder
	b.WriteString("entries:\n")
	for i := range *applyCount {
		fmt.Fprintf(&b, "  bulk-%06d: {task: tasks.add, every: %ds, args: [%d]}\n", i, 60+i%600, i)
	}
	file := filepath.Join(c.dir, "big.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, out, errs := c.apiCLI(lead, "admin", "entries", "apply", "-f", file)
	took := time.Since(start)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("applied %d/%d entries", *applyCount, *applyCount)) {
		t.Fatalf("apply: exit %d\n%s\n%s", code, lastLines(out, 3), errs)
	}
	waitFor(t, 60*time.Second, "every entry in the leader's status", func() bool {
		st, err := getStatus(lead, 30*time.Second)
		return err == nil && st.EntriesTotal == *applyCount+1
	})
	t.Logf("applied %d entries in %s (budget %s); all running after %s", *applyCount, took.Round(10*time.Millisecond), *applyBudget, time.Since(start).Round(10*time.Millisecond))
	if took > *applyBudget {
		t.Errorf("apply took %s, over the %s budget", took, *applyBudget)
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(len(l)-n, 0):], "\n")
}
