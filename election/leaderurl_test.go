package election

import (
	"errors"
	"testing"
)

// TestLeaderURL: the leader's address is its registration's, with a
// scheme added to the host:port an older release registered; a leader
// without one is ErrNotRegistered.
func TestLeaderURL(t *testing.T) {
	replicas := []Replica{
		{ID: "a", HTTP: "http://10.0.0.1:8080"},
		{ID: "b", HTTP: "10.0.0.2:8080"},
		{ID: "c", HTTP: "https://beatd-c.example:8443/"},
		{ID: "d"},
	}
	for _, tc := range []struct {
		name    string
		leader  string
		want    string
		wantErr error
	}{
		{name: "registered URL", leader: "a", want: "http://10.0.0.1:8080"},
		{name: "older host:port", leader: "b", want: "http://10.0.0.2:8080"},
		{name: "https, trailing slash", leader: "c", want: "https://beatd-c.example:8443"},
		{name: "registered without an address", leader: "d", wantErr: ErrNotRegistered},
		{name: "not registered", leader: "e", wantErr: ErrNotRegistered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LeaderURL(Leader{ID: tc.leader, Token: 7}, replicas)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Errorf("LeaderURL(%s) = %q, %v; want %q, %v", tc.leader, got, err, tc.want, tc.wantErr)
			}
		})
	}
}
