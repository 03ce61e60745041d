package redis

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestNewClient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		cfg      BrokerConfig
		wantAddr string
		wantDB   int
		wantPass string
		// wantProto is the RESP version spoken: 2, as Kombu, unless the
		// URL says otherwise (0 here stands for 2).
		wantProto int
		wantErr   string
	}{
		{name: "default", cfg: BrokerConfig{}, wantAddr: "127.0.0.1:6379"},
		{name: "RESP3 when asked", cfg: BrokerConfig{URL: "redis://h:1/0?protocol=3"}, wantAddr: "h:1", wantProto: 3},
		{name: "user and db", cfg: BrokerConfig{URL: "redis://bob:secret@redis.example:6380/3"}, wantAddr: "redis.example:6380", wantDB: 3, wantPass: "secret"},
		{name: "password override", cfg: BrokerConfig{URL: "redis://:inurl@h:1/0", Password: "fromfile"}, wantAddr: "h:1", wantPass: "fromfile"},
		{name: "unix", cfg: BrokerConfig{URL: "unix:///run/redis.sock?db=2"}, wantAddr: "/run/redis.sock", wantDB: 2},
		{name: "redis+socket", cfg: BrokerConfig{URL: "redis+socket:///run/redis.sock"}, wantAddr: "/run/redis.sock"},
		{name: "rediss none", cfg: BrokerConfig{URL: "rediss://h:6380/0?ssl_cert_reqs=none"}, wantAddr: "h:6380"},
		{name: "rediss bad reqs", cfg: BrokerConfig{URL: "rediss://h:6380/0?ssl_cert_reqs=maybe"}, wantErr: "ssl_cert_reqs"},
		{name: "rediss missing CA", cfg: BrokerConfig{URL: "rediss://h:6380/0?ssl_ca_certs=/nonexistent.pem"}, wantErr: "broker CA"},
		{name: "sentinel needs master", cfg: BrokerConfig{URL: "sentinel://h1:26379;sentinel://h2:26379"}, wantErr: "master name"},
		{name: "sentinel", cfg: BrokerConfig{URL: "sentinel://:pw@h1:26379/1;sentinel://h2:26379", MasterName: "mymaster"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClient(tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cl, ok := c.(*redis.Client)
			if !ok {
				t.Fatalf("client %T", c)
			}
			if want := max(tt.wantProto, 2); cl.Options().Protocol != want {
				t.Errorf("protocol %d, want %d", cl.Options().Protocol, want)
			}
			if tt.wantAddr != "" {
				o := cl.Options()
				if o.Addr != tt.wantAddr || o.DB != tt.wantDB || o.Password != tt.wantPass {
					t.Errorf("addr %q db %d pass %q", o.Addr, o.DB, o.Password)
				}
				if strings.HasPrefix(tt.cfg.URL, "rediss") && o.TLSConfig == nil {
					t.Error("rediss without TLS")
				}
			}
		})
	}
}
