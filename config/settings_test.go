package config

import "testing"

// TestSameSettings: configs made from one load of the file (by
// WithEntries, as a merger makes them) have the same settings; another
// load whose settings differ, or another file, does not.
func TestSameSettings(t *testing.T) {
	load := func(y string) *Config {
		t.Helper()
		c, err := Parse("s.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const base = "timezone: Europe/Paris\ndefaults: {catchup: all}\namqp: {task_queue_max_priority: 5}\nentries:\n  a: {task: t, every: 1m}\n"
	one := load(base)
	for _, tc := range []struct {
		name string
		a, b *Config
		want bool
	}{
		{"the config itself", one, one, true},
		{"its entries replaced", one, one.WithEntries(nil), true},
		{"both nil", nil, nil, true},
		{"one nil", one, nil, false},
		{"another timezone", one, load("timezone: UTC\ndefaults: {catchup: all}\namqp: {task_queue_max_priority: 5}\nentries:\n  a: {task: t, every: 1m}\n"), false},
		{"other defaults", one, load("timezone: Europe/Paris\ndefaults: {catchup: skip}\namqp: {task_queue_max_priority: 5}\nentries:\n  a: {task: t, every: 1m}\n"), false},
		{"another load of the same file", one, load(base), false},
	} {
		if got := tc.a.SameSettings(tc.b); got != tc.want {
			t.Errorf("%s: SameSettings %v, want %v", tc.name, got, tc.want)
		}
	}
}
