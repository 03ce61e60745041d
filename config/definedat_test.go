package config

import (
	"strings"
	"testing"
	"time"
)

// StampDefinedAt puts defined_at first in a JSON object, replacing one
// the document has; ParseEntry reads it as DefinedBy (its second rounded
// up), and it leaves the Fingerprint as the unstamped document's.
func TestStampDefinedAt(t *testing.T) {
	at := time.Date(2026, 12, 5, 18, 55, 10, 123456789, time.FixedZone("x", 3600))
	const stamp = `{"defined_at":"2026-12-05T17:55:10.123Z"`
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"compact", `{"task":"t","every":"1s"}`, stamp + `,"task":"t","every":"1s"}`},
		{"spaced", " {\n  \"task\": \"t\", \"every\": \"1s\"\n}\n", stamp + ",\"task\": \"t\", \"every\": \"1s\"\n}"},
		{"empty object", `{ }`, stamp + `}`},
		{"given: replaced", `{"task":"t","defined_at":"1999-01-01T00:00:00Z","every":"1s"}`, stamp + `,"every":"1s","task":"t"}`},
		{"not an object: as it was", `["task"]`, `["task"]`},
		{"not JSON: as it was", `task: t`, `task: t`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StampDefinedAt([]byte(tc.doc), at)
			if err != nil || string(got) != tc.want {
				t.Fatalf("StampDefinedAt(%q) = %q, %v; want %q", tc.doc, got, err, tc.want)
			}
		})
	}

	plain, err := (*Config)(nil).ParseEntry("e", []byte(`{"task":"t","every":"1s"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !plain.DefinedBy().IsZero() {
		t.Errorf("unstamped entry: DefinedBy %v, want zero", plain.DefinedBy())
	}
	doc, _ := StampDefinedAt([]byte(`{"task":"t","every":"1s"}`), at)
	e, err := (*Config)(nil).ParseEntry("e", doc)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 12, 5, 17, 55, 10, 999999999, time.UTC); !e.DefinedBy().Equal(want) {
		t.Errorf("DefinedBy = %v, want %v", e.DefinedBy(), want)
	}
	if e.Fingerprint != plain.Fingerprint {
		t.Error("defined_at changed the Fingerprint")
	}
}

// defined_at is a document's alone, a time within what a uint32 second
// holds.
func TestDefinedAtRefused(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"not a time", `{"defined_at":"yesterday","task":"t","every":"1s"}`, "defined_at must be an RFC 3339 time"},
		{"past 2106", `{"defined_at":"2150-01-01T00:00:00Z","task":"t","every":"1s"}`, "outside 1970-01-01 .. 2106-02-07"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := (*Config)(nil).ParseEntry("e", []byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"/defined_at"`) {
				t.Fatalf("ParseEntry = %v, want %q at /defined_at", err, tc.want)
			}
		})
	}
	_, err := Parse("schedules.yaml", []byte("entries:\n  e: {task: t, every: 1s, defined_at: 2026-12-05T18:55:10Z}\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown key "defined_at"`) {
		t.Fatalf("defined_at in a file: %v, want unknown key", err)
	}
}
