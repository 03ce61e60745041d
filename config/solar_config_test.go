package config

import (
	"strings"
	"testing"

	"github.com/beatd/beatd/schedule"
)

func TestSolarConfig(t *testing.T) {
	cfg, err := Parse("s.yaml", []byte("entries:\n  rise: {task: t, solar: {event: sunrise, lat: 52.52, lon: 13.40}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, ok := cfg.Entry("rise").Schedule.(*schedule.Solar)
	if !ok || s.Event != "sunrise" || s.Lat != 52.52 || s.Lon != 13.40 {
		t.Fatalf("schedule = %#v", cfg.Entry("rise").Schedule)
	}
	for _, tt := range []struct{ yaml, want string }{
		{"entries:\n  a: {task: t, solar: {event: moonrise, lat: 1, lon: 2}}\n", "s.yaml:2:31: solar: unknown event \"moonrise\""},
		{"entries:\n  a: {task: t, solar: {event: sunset, lat: 91, lon: 2}}\n", "s.yaml:2:44: solar: latitude 91"},
		{"entries:\n  a: {task: t, solar: {event: sunset, lat: 1}}\n", "s.yaml:2:23: solar: missing key lon"},
		{"entries:\n  a: {task: t, solar: {event: sunset, lat: 1, lon: 1}, every: 5s}\n", "entry \"a\": solar and every both given"},
	} {
		_, err := Parse("s.yaml", []byte(tt.yaml))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want %q", tt.yaml, err, tt.want)
		}
	}
}
