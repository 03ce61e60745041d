package config

import (
	"fmt"
	"strings"
	"testing"
)

func TestAMQPSection(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("a.yaml", []byte(`amqp:
  task_queue_max_priority: 10
  queues:
    reports: {queue_arguments: {x-queue-mode: lazy, x-max-priority: 5}, exchange: rx, routing_key: rk}
    lazy: {queue_arguments: {x-queue-mode: lazy}}
entries:
  a: {task: t, every: 1s, options: {queue: reports}}
  b: {task: t, every: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		queue, want string
	}{
		{"reports", "[x-queue-mode x-max-priority] [lazy 5]"}, // its own x-max-priority wins
		{"lazy", "[x-queue-mode x-max-priority] [lazy 10]"},   // the global one added, as Celery does
		{"celery", "[x-max-priority] [10]"},
	}
	for _, tt := range tests {
		m := cfg.AMQP.QueueArguments(tt.queue)
		if got := fmt.Sprint(m.Keys, m.Values); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.queue, got, tt.want)
		}
	}
	if q := cfg.AMQP.Queues["reports"]; q.Exchange != "rx" || q.RoutingKey != "rk" {
		t.Errorf("reports: %+v", q)
	}
	if !cfg.Entry("a").Options.QueueSet || cfg.Entry("b").Options.QueueSet || cfg.Entry("b").Options.Queue != DefaultQueue {
		t.Error("QueueSet wrong")
	}
	// Without the section a default app declares nothing extra.
	plain, err := Parse("p.yaml", []byte("entries:\n  a: {task: t, every: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m := plain.AMQP.QueueArguments("celery"); m != nil {
		t.Errorf("default arguments %v", m)
	}
}

func TestAMQPSectionErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		amqp, want string
	}{
		{"amqp: {task_queue_max_priority: 0}", "a.yaml:1:33: amqp.task_queue_max_priority must be between 1 and 255"},
		{"amqp: {task_queue_max_priority: x}", "a.yaml:1:33:"},
		{"amqp: {bogus: 1}", `a.yaml:1:8: unknown key "bogus" in amqp`},
		{"amqp: {queues: [a]}", "a.yaml:1:16: amqp.queues must be a mapping"},
		{"amqp: {queues: {q: {queue_arguments: [1]}}}", "a.yaml:1:38: amqp.queues.q.queue_arguments must be a mapping"},
		{"amqp: {queues: {q: {queue_arguments: {x-max-priority: 300}}}}", "a.yaml:1:55: queue argument x-max-priority must be an integer between 1 and 255"},
		{"amqp: {queues: {q: {queue_arguments: {x-n: -3000000000}}}}", "a.yaml:1:44: queue argument \"x-n\": integers below"},
		{"amqp: {queues: {q: {exchange: ''}}}", "a.yaml:1:31: amqp.queues.q.exchange must be a non-empty string"},
		{"amqp: {queues: {q: {arguments: {}}}}", `unknown key "arguments" in amqp.queues.q`},
	}
	for _, tt := range tests {
		_, err := Parse("a.yaml", []byte(tt.amqp+"\nentries:\n  a: {task: t, every: 1s}\n"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.amqp, err, tt.want)
		}
	}
}
