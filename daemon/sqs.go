package daemon

import (
	"context"
	"fmt"

	"github.com/beatd/beatd/broker"
	sqsbroker "github.com/beatd/beatd/broker/sqs"
	"github.com/beatd/beatd/celery"
)

// newSQS makes the SQS dispatcher and runs its start-up check: the AWS
// chain's credentials, and each queue of the config found, or created as
// Kombu would. Any failure stops the start with the reason.
func (m *Main) newSQS(ctx context.Context, prefix string, tasks []*celery.Task) (*sqsbroker.SQS, error) {
	if m.brokerPass != "" {
		return nil, fmt.Errorf("broker %s: SQS takes no password (--broker-password-file, BEATD_BROKER_PASSWORD): its credentials come from the AWS chain",
			broker.Redacted(m.Broker))
	}
	s, err := sqsbroker.New(ctx, sqsbroker.Options{URL: m.Broker, Etcd: m.etcd, Prefix: prefix,
		Registerer: m.registry, Logger: m.log, Clock: m.clock})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, probeBudget)
	defer cancel()
	if err := s.Check(cctx, tasks...); err != nil {
		return nil, fmt.Errorf("broker %s: start-up check failed: %w", broker.Redacted(m.Broker), err)
	}
	m.log.Info("broker check passed", "broker", broker.Redacted(m.Broker), "region", s.Region())
	if m.Outcomes.TaskEvents {
		m.log.Warn("Celery's task events do not travel over SQS: run outcomes, overlap and pause_after_failures need --result-backend")
	}
	return s, nil
}
