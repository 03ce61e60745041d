package main

import (
	"io"
	"testing"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/testkit/fuzzcheck"
)

// FuzzApplyEntries is beatd entries apply's input path: the file is read
// (its aliases bounded), turned into the JSON apply sends, and each entry
// of it parsed as the server parses it, within fuzzcheck's bounds; an
// accepted entry fires at strictly increasing slots. Its corpus
// (testdata/fuzz/FuzzApplyEntries) holds issue 45's attacks.
func FuzzApplyEntries(f *testing.F) {
	f.Add([]byte("entries:\n  a: {task: t, every: 1s, kwargs: {z: 1, a: 2.5, s: '07', n: null, b: true}}\n"))
	f.Add([]byte("name: a\nsource: api\nactive: true\nspec:\n  task: t\n  every: 1s\nmod_revision: 5\n"))
	f.Add([]byte("entries:\n  - name: f\n    source: file\n  - name: a\n    source: api\n    spec: {task: t, cron: '* * * * *'}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		type parsed struct {
			name  string
			entry *config.Entry
		}
		var accepted []parsed
		fuzzcheck.Bounded(t, len(data), func() {
			entries, err := applyEntries(io.Discard, "fuzz.yaml", data)
			if err != nil {
				return
			}
			for i := 0; i+1 < len(entries.Content); i += 2 {
				body, err := nodeJSON(entries.Content[i+1], 0)
				if err != nil {
					continue
				}
				name := entries.Content[i].Value
				if e, err := (*config.Config)(nil).ParseEntry(name, body); err == nil {
					accepted = append(accepted, parsed{name, e})
				}
			}
		})
		for _, p := range accepted {
			fuzzcheck.Slots(t, p.name, p.entry.Schedule, config.DefaultMinInterval)
		}
	})
}
