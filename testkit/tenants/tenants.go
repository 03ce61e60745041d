// Package tenants writes the entries the scale benchmarks load, as SaaS
// tenants have them: one generator, so every benchmark that says
// "tenant-style" runs the same workload.
package tenants

import (
	"fmt"
	"io"
	"math/rand/v2"
)

// Write writes a schedules file of n runtime entries, phases spread:
// intervals from 1 min to 1 day (mostly hourly and slower), crontabs
// every 1–12 hours in six zones, one-offs. At a million entries they
// fire ~300 times a second. The same n writes the same file.
func Write(w io.Writer, n int) error {
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney", "America/Sao_Paulo"}
	lw := &lineWriter{w: w}
	lw.printf("entries:\n")
	for i := range n {
		name := fmt.Sprintf("tenant-%07d", i)
		switch k := i % 10; {
		case k < 6:
			// 1 min 1%, 5 min 4%, 1 h 45%, 6 h 25%, 1 day 25%.
			every := 86400
			switch p := rng.IntN(100); {
			case p < 1:
				every = 60
			case p < 5:
				every = 300
			case p < 50:
				every = 3600
			case p < 75:
				every = 21600
			}
			lw.printf("  %s: {task: tasks.sync, every: %ds, start_at: '2026-01-01T%02d:%02d:%02dZ', args: [%d]}\n",
				name, every, rng.IntN(24), rng.IntN(60), rng.IntN(60), i)
		case k < 9:
			lw.printf("  %s: {task: tasks.report, crontab: {minute: '%d', hour: '*/%d'}, timezone: %s, kwargs: {tenant: %d}}\n",
				name, rng.IntN(60), []int{1, 2, 3, 4, 6, 12}[rng.IntN(6)], zones[rng.IntN(len(zones))], i)
		default:
			lw.printf("  %s: {task: tasks.remind, at: '2027-%02d-%02dT%02d:00:00Z', args: [%d]}\n",
				name, 1+rng.IntN(12), 1+rng.IntN(28), rng.IntN(24), i)
		}
	}
	return lw.err
}

// lineWriter keeps the first write error, so Write checks once.
type lineWriter struct {
	w   io.Writer
	err error
}

func (l *lineWriter) printf(format string, a ...any) {
	if l.err == nil {
		_, l.err = fmt.Fprintf(l.w, format, a...)
	}
}
