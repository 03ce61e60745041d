package config

import "testing"

// BenchmarkParseEntryJSON parses the runtime entries a leader reads at
// its start: compact JSON, as the entries API stores them (stamped defined_at), of the three
// tenant-style kinds (testkit/tenants).
func BenchmarkParseEntryJSON(b *testing.B) {
	docs := [][]byte{
		[]byte(`{"defined_at":"2026-12-06T18:00:00.123Z","task":"tasks.sync","every":"3600s","start_at":"2026-01-01T13:04:05Z","args":[123456]}`),
		[]byte(`{"defined_at":"2026-12-06T18:00:00.123Z","task":"tasks.report","crontab":{"minute":"17","hour":"*/6"},"timezone":"Europe/Berlin","kwargs":{"tenant":123457}}`),
		[]byte(`{"defined_at":"2026-12-06T18:00:00.123Z","task":"tasks.remind","at":"2027-03-14T09:00:00Z","args":[123459]}`),
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := (*Config)(nil).ParseEntry("tenant-0123456", docs[i%len(docs)]); err != nil {
			b.Fatal(err)
		}
	}
}
