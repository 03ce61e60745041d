package daemon

import "testing"

// TestBatchFor: RabbitMQ keeps batches of 512, which bound its journal;
// Redis takes the scheduler's default.
func TestBatchFor(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"redis://127.0.0.1:6379/0", 0},
		{"rediss://h:6380/0", 0},
		{"amqp://guest:guest@127.0.0.1:5672//", amqpBatch},
		{"amqps://h:5671/vhost", amqpBatch},
	} {
		if got := batchFor(tc.url); got != tc.want {
			t.Errorf("batchFor(%q) = %d, want %d", tc.url, got, tc.want)
		}
	}
}
