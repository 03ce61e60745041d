package daemon

import (
	"net"
	"strings"
	"testing"
)

func TestAdvertised(t *testing.T) {
	tests := []struct {
		listen string
		etcd   []string
		want   string // exact, or a prefix ending in ":" for "some host"
	}{
		{"127.0.0.1:8080", nil, "127.0.0.1:8080"},
		{"10.1.2.3:9", []string{"http://127.0.0.1:2379"}, "10.1.2.3:9"},
		{"[::]:8080", []string{"http://127.0.0.1:2379"}, "127.0.0.1:8080"},
		{"0.0.0.0:8080", []string{"bad url \x7f", "http://127.0.0.1:2379"}, "127.0.0.1:8080"},
	}
	for _, tt := range tests {
		if got := advertised(tt.listen, tt.etcd); got != tt.want {
			t.Errorf("advertised(%q, %v) = %q, want %q", tt.listen, tt.etcd, got, tt.want)
		}
	}
	// Without etcd endpoints to route by, the host name.
	if got := advertised("[::]:8080", nil); strings.HasPrefix(got, "[::]") || !strings.HasSuffix(got, ":8080") {
		t.Errorf("advertised without etcd = %q", got)
	}
}

// TestAdvertisedURL: --advertise-url is the one address: the registry the
// console follows to the leader and the catalog's status URL both use it.
func TestAdvertisedURL(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct{ flag, want string }{
		{"", "http://" + ln.Addr().String()},
		{"https://beatd-0.beatd.svc:8443/", "https://beatd-0.beatd.svc:8443"},
	} {
		m := &Main{Options: Options{AdvertiseURL: tc.flag}, httpLn: ln}
		if got := m.advertisedURL(); got != tc.want {
			t.Errorf("--advertise-url %q: advertised %q, want %q", tc.flag, got, tc.want)
		}
		if got := m.statusURL(); got != tc.want+"/status" {
			t.Errorf("--advertise-url %q: status URL %q", tc.flag, got)
		}
	}
}
