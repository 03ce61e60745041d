package daemon

import "testing"

// TestBatchFor: RabbitMQ keeps batches of 512, which bound its journal,
// SQS 256, which bound its send records in etcd; Redis takes the
// scheduler's default. The journaled brokers persist after each batch.
func TestBatchFor(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"redis://127.0.0.1:6379/0", 0},
		{"rediss://h:6380/0", 0},
		{"amqp://guest:guest@127.0.0.1:5672//", amqpBatch},
		{"amqps://h:5671/vhost", amqpBatch},
		{"sqs://?region=eu-west-1", sqsBatch},
		{"SQS://127.0.0.1:4100", sqsBatch},
	} {
		if got := batchFor(tc.url); got != tc.want {
			t.Errorf("batchFor(%q) = %d, want %d", tc.url, got, tc.want)
		}
		if got, want := persistEachBatch(tc.url), tc.want != 0; got != want {
			t.Errorf("persistEachBatch(%q) = %v, want %v", tc.url, got, want)
		}
	}
}
