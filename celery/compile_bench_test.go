package celery_test

import (
	"testing"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/config"
)

// BenchmarkCompile is a template's cost for an entry that fires too
// rarely to keep one (at a million entries most fires compile).
func BenchmarkCompile(b *testing.B) {
	cfg, err := config.Parse("bench.yaml", []byte("entries:\n  e: {task: tasks.report, crontab: {minute: '7', hour: '*/3'}, timezone: Europe/Berlin, kwargs: {tenant: 123456}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	spec := cfg.Entries[0].Spec()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := celery.Compile(spec, "beatd/bench", "beatd@bench", ""); err != nil {
			b.Fatal(err)
		}
	}
}
