package daemon

import (
	"testing"

	redisbroker "github.com/beatd/beatd/broker/redis"
)

func TestBrokerMinReplicas(t *testing.T) {
	for _, tc := range []struct {
		flag    int
		broker  string
		want    int
		wantErr bool
	}{
		{minReplicasUnset, "sentinel://a:26379;sentinel://b:26379", redisbroker.ReplicasAuto, false},
		{minReplicasUnset, "redis://127.0.0.1:6379/0", 0, false},
		{minReplicasUnset, "rediss://127.0.0.1:6380/0", 0, false},
		{0, "sentinel://a:26379", 0, false},
		{1, "redis://127.0.0.1:6379/0", 1, false},
		{2, "sentinel://a:26379", 2, false},
		{-1, "redis://127.0.0.1:6379/0", 0, true},
		{-5, "sentinel://a:26379", 0, true},
	} {
		got, err := brokerMinReplicas(tc.flag, tc.broker)
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("brokerMinReplicas(%d, %q) = %d, %v; want %d, error %v", tc.flag, tc.broker, got, err, tc.want, tc.wantErr)
		}
	}
}
