package celery_test

import (
	"testing"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
)

// BenchmarkAppendMessage is the per-fire cost of an entry's message: the
// hot path of every publish. "plain" is what most entries are; a chain
// or a template renders the body for each slot.
func BenchmarkAppendMessage(b *testing.B) {
	for _, c := range []struct{ name, entry string }{
		{"plain", "{task: tasks.report, crontab: {minute: '7'}, timezone: Europe/Berlin, kwargs: {tenant: 123456}}"},
		{"templated", "{task: tasks.report, crontab: {minute: '7'}, timezone: Europe/Berlin, kwargs: {tenant: 123456, day: '{{ slot.date }}', since: '{{ prev_slot }}'}}"},
		{"chain3", "{task: tasks.fetch, crontab: {minute: '7'}, kwargs: {tenant: 123456}, chain: [{task: tasks.transform}, {task: tasks.notify, kwargs: {to: ops}}], link_error: {task: tasks.alert}}"},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg, err := config.Parse("bench.yaml", []byte("entries:\n  e: "+c.entry+"\n"))
			if err != nil {
				b.Skip(err) // the schema before chains and templates
			}
			task, err := celery.Compile(cfg.Entries[0].Spec(), "beatd/bench", "beatd@bench", "")
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 0, 4096)
			slot := time.Date(2026, 11, 30, 10, 7, 0, 0, time.UTC)
			now := slot.Add(3 * time.Millisecond)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				f := celery.Fire{Task: task, Slot: slot.Add(time.Duration(i) * time.Hour)}
				buf = task.AppendMessage(buf[:0], &f, 42, now)
				i++
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}
