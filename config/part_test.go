package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestCheckPart checks that a part of a file is the whole file's entries
// whose names it keeps, the same entries, in the whole-file parse and the
// chunked one alike.
func TestCheckPart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		entries int
	}{
		{"small", 40},
		{"chunked", 6000}, // past chunkThreshold
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString("timezone: Europe/Berlin\ndefaults: {options: {queue: low}}\nentries:\n")
			for i := range tc.entries {
				fmt.Fprintf(&b, "  e%05d: {task: app.tasks.t%d, every: %ds, args: [%d, \"padding to pass the chunked threshold\"]}\n", i, i%9, 10+i%50, i)
			}
			data := []byte(b.String())
			if tc.entries > 1000 && len(data) < chunkThreshold {
				t.Fatalf("%d bytes: under the chunked threshold", len(data))
			}
			whole, err := Check("s.yaml", data, Options{})
			if err != nil {
				t.Fatal(err)
			}
			keep := func(name string) bool { return name[len(name)-1]%4 == 1 }
			part, err := CheckPart("s.yaml", data, Options{}, keep)
			if err != nil {
				t.Fatal(err)
			}
			var want []*Entry
			for _, e := range whole.Entries {
				if keep(e.Name) {
					want = append(want, e)
				}
			}
			if len(part.Entries) != len(want) || len(want) == 0 {
				t.Fatalf("part has %d entries, want %d", len(part.Entries), len(want))
			}
			for i, e := range part.Entries {
				if e.Name != want[i].Name || e.Fingerprint != want[i].Fingerprint || e.Options.Queue != "low" {
					t.Errorf("entry %d: %s %x (queue %s), want %s %x", i, e.Name, e.Fingerprint, e.Options.Queue, want[i].Name, want[i].Fingerprint)
				}
			}
			if part.DefaultsHash() != whole.DefaultsHash() || part.Timezone.String() != whole.Timezone.String() {
				t.Error("the part's defaults differ from the whole file's")
			}
		})
	}
	// A part still refuses a file that fails outside it: the YAML is read
	// whole, and its names checked.
	if _, err := CheckPart("s.yaml", []byte("entries:\n  a: {task: t, every: 10s}\n  a: {task: t, every: 10s}\n"), Options{},
		func(string) bool { return false }); err == nil || !strings.Contains(err.Error(), "duplicate entry") {
		t.Errorf("duplicate names outside the part: %v", err)
	}
}

// BenchmarkCheckPart is what a sharded replica's term of one shard of 4
// pays to parse its entries of a 40,000-entry file, against the whole
// file's parse (a reload).
func BenchmarkCheckPart(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("entries:\n")
	for i := range 40000 {
		fmt.Fprintf(&sb, "  file-%05d: {task: app.tasks.file, every: %ds, args: [%d], options: {queue: q%d}}\n", i, 10+i%50, i, i%7)
	}
	data := []byte(sb.String())
	for _, tc := range []struct {
		name string
		keep func(string) bool
	}{
		{"whole", nil},
		{"quarter", func(name string) bool { return name[len(name)-1]%4 == 0 }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := CheckPart("s.yaml", data, Options{}, tc.keep); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
