package sources

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/beatd/beatd/config"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func mustParse(t *testing.T, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse("schedules.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMergerSourcesConflictsAndBadEntries(t *testing.T) {
	t.Parallel()
	var applied *config.Config
	reg := prometheus.NewRegistry()
	m := New(Config{Apply: func(c *config.Config) error { applied = c; return nil }, Registry: reg,
		Priority: []string{API, File, DCB}})
	if err := m.SetFile(mustParse(t, "defaults: {options: {queue: low}}\nentries:\n  a: {task: t.a, every: 10s}\n  shared: {task: t.file, every: 10s}\n")); err != nil {
		t.Fatal(err)
	}
	err := m.SetSource(API, map[string][]byte{
		"b":      []byte(`{"task":"t.b","every":"5s"}`),
		"shared": []byte(`{"task":"t.api","every":"5s"}`),
		"bad":    []byte(`{"task":"t.bad","every":"never"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range applied.Entries {
		got[e.Name] = e.Source + ":" + e.Task
	}
	want := map[string]string{"a": "file:t.a", "b": "api:t.b", "shared": "api:t.api"}
	if len(got) != len(want) {
		t.Fatalf("merged %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("entry %s = %s, want %s", k, got[k], v)
		}
	}
	if q := applied.Entry("b").Options.Queue; q != "low" {
		t.Errorf("file defaults not applied to an api entry: queue %q", q)
	}
	cs := m.Conflicts()
	if len(cs) != 1 || cs[0].Name != "shared" || cs[0].Winner != API || strings.Join(cs[0].Sources, ",") != "api,file" {
		t.Errorf("conflicts %+v", cs)
	}
	if v := testutil.ToFloat64(m.conflictG); v != 1 {
		t.Errorf("conflict gauge %v", v)
	}
	if v := testutil.ToFloat64(m.invalidG.WithLabelValues(API)); v != 1 {
		t.Errorf("invalid gauge %v", v)
	}
	h := m.Health()
	if len(h) != 2 || h[0].Source != API || h[0].Invalid["bad"] == "" {
		t.Errorf("health %+v", h)
	}

	// A failing source keeps its last good set and is reported.
	m.SetError(API, errors.New("etcd gone"))
	if err := m.Err(); err == nil || !strings.Contains(err.Error(), "etcd gone") {
		t.Errorf("Err() = %v", err)
	}
	if applied.Entry("b") == nil {
		t.Error("a failing source lost its entries")
	}
	if v := testutil.ToFloat64(m.upG.WithLabelValues(API)); v != 0 {
		t.Errorf("up gauge %v", v)
	}
	// Recovery: the shared name goes away, the conflict with it.
	if err := m.SetSource(API, map[string][]byte{"b": []byte(`{"task":"t.b","every":"5s"}`)}); err != nil {
		t.Fatal(err)
	}
	if m.Err() != nil || len(m.Conflicts()) != 0 || applied.Entry("shared").Source != File {
		t.Errorf("after recovery: err %v conflicts %v shared from %s", m.Err(), m.Conflicts(), applied.Entry("shared").Source)
	}
	// A file whose defaults change re-reads the api entries with them.
	fpBefore := applied.Entry("b").Fingerprint
	if err := m.SetFile(mustParse(t, "defaults: {options: {queue: high}}\nentries:\n  a: {task: t.a, every: 10s}\n")); err != nil {
		t.Fatal(err)
	}
	if e := applied.Entry("b"); e.Options.Queue != "high" || e.Fingerprint == fpBefore {
		t.Errorf("api entry not re-read with new defaults: queue %q", e.Options.Queue)
	}
	// An apply that fails keeps the previous merge.
	m.c.Apply = func(*config.Config) error { return errors.New("no") }
	if err := m.SetSource(API, map[string][]byte{}); err == nil {
		t.Error("failed apply not reported")
	}
	if m.Current().Entry("b") == nil {
		t.Error("a failed apply replaced the running merge")
	}
	// A file change whose apply fails leaves the api entries parsed
	// under its defaults in the cache; the next merge, under the file
	// kept, parses them again.
	if err := m.SetFile(mustParse(t, "defaults: {options: {queue: refused}}\nentries:\n  a: {task: t.a, every: 10s}\n")); err == nil {
		t.Error("failed apply not reported")
	}
	m.c.Apply = func(c *config.Config) error { applied = c; return nil }
	if err := m.SetSource(API, map[string][]byte{"b": []byte(`{"task":"t.b","every":"5s"}`)}); err != nil {
		t.Fatal(err)
	}
	if q := applied.Entry("b").Options.Queue; q != "high" {
		t.Errorf("after a refused file, api entry has queue %q, want the kept file's high", q)
	}
}

func TestParsePriority(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want, err string
	}{
		{"", "file,api,django-celery-beat", ""},
		{"django-celery-beat", "django-celery-beat,file,api", ""},
		{"api, file", "api,file,django-celery-beat", ""},
		{"api,api", "", "twice"},
		{"redbeat", "", "unknown source"},
	}
	for _, tt := range tests {
		got, err := ParsePriority(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != tt.want {
			t.Errorf("%q: %v %v, want %s", tt.in, got, err, tt.want)
		}
	}
}

// TestRowSize: a leader at a million runtime entries holds a million
// rows; each byte here is a megabyte there.
func TestRowSize(t *testing.T) {
	if n := unsafe.Sizeof(row{}); n > 40 {
		t.Errorf("row is %d bytes, want at most 40", n)
	}
}

// TestPrimedEntries: a runtime entry the entries API parsed on its way
// into etcd is the one the merger runs when the watch brings the same
// document back, through either merge; another document, another file's
// defaults or another source parse their own.
func TestPrimedEntries(t *testing.T) {
	t.Parallel()
	file := mustParse(t, "entries:\n  f0: {task: t.f, every: 10s}\n")
	other := mustParse(t, "defaults: {options: {queue: q2}}\nentries:\n  f0: {task: t.f, every: 10s}\n")
	base := map[string][]byte{}
	for i := range 100 {
		base[fmt.Sprint("b", i)] = []byte(`{"task":"t.b","every":"5s"}`)
	}
	doc := []byte(`{"task":"t.a","every":"7s"}`)
	for _, tc := range []struct {
		name   string
		base   map[string][]byte // the source before: few entries merge whole, many entry by entry
		source string
		file   *config.Config // the file Prime is told the entry was parsed under
		doc    []byte         // the document the watch brings back
		taken  bool
	}{
		{"whole merge", nil, API, file, doc, true},
		{"delta merge", base, API, file, doc, true},
		{"another document", base, API, file, []byte(`{"task":"t.a","every":"8s"}`), false},
		{"another file", base, API, other, doc, false},
		{"another source", base, DCB, file, doc, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{Apply: func(*config.Config) error { return nil }, ApplyDelta: func(*config.Config, []string) error { return nil }})
			if err := m.SetFile(file); err != nil {
				t.Fatal(err)
			}
			if err := m.SetSource(API, clone(tc.base)); err != nil {
				t.Fatal(err)
			}
			primed, err := tc.file.ParseEntry("n", doc)
			if err != nil {
				t.Fatal(err)
			}
			m.Prime(tc.file, "n", doc, primed)
			if err := m.UpdateSource(tc.source, map[string][]byte{"n": tc.doc}); err != nil {
				t.Fatal(err)
			}
			got := m.Current().Entry("n")
			if got == nil {
				t.Fatal("entry n is not running")
			}
			if (got == primed) != tc.taken {
				t.Errorf("primed entry taken: %v, want %v", got == primed, tc.taken)
			}
			if got.Source != tc.source {
				t.Errorf("source %q, want %q", got.Source, tc.source)
			}
			if len(m.primed) != 0 && tc.source == API {
				t.Errorf("%d primed rows left after the watch brought n back", len(m.primed))
			}
		})
	}
}
