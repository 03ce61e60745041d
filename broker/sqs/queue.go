package sqs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/beatd/beatd/celery"
)

// kombuVisibilityTimeout is the VisibilityTimeout Kombu's SQS transport
// creates a queue with (default_visibility_timeout, 30 minutes).
const kombuVisibilityTimeout = "1800"

// EntityName maps a Kombu queue name to its SQS name as Kombu's SQS
// transport does (Channel.entity_name): '.' becomes '-', every other
// punctuation character but '-' and '_' becomes '_', and a ".fifo" suffix
// is kept.
func EntityName(name string) string {
	if base, ok := strings.CutSuffix(name, ".fifo"); ok {
		return translate(base) + ".fifo"
	}
	return translate(name)
}

func translate(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '.':
			return '-'
		case r == '-' || r == '_':
			return r
		case r < 0x80 && strings.ContainsRune(pyPunctuation, r):
			return '_'
		}
		return r
	}, s)
}

// pyPunctuation is Python's string.punctuation.
const pyPunctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"

// queueName is the SQS name of the queue t's messages go to: Kombu's
// virtual transport delivers a message sent through the default exchange
// to the queue its routing key names, and prefixes it with
// queue_name_prefix.
func (s *SQS) queueName(t *celery.Task) (string, error) {
	r := t.AMQPRoute()
	if r.PubExchange != "" {
		// Kombu keeps an SQS transport's exchanges in each process's
		// memory: a message sent to one reaches only the queues bound in
		// the sender, and Celery's sender binds none (a capture sent
		// with exchange and routing_key reached no queue).
		return "", fmt.Errorf("sqs: entry %q: exchange %q with routing_key %q cannot be routed on SQS (Kombu keeps SQS exchanges in each process's memory); name the queue instead",
			t.Name, r.PubExchange, r.PubKey)
	}
	return EntityName(s.url.QueueNamePrefix + r.PubKey), nil
}

// queueURL returns the URL of the SQS queue name: from predefined_queues,
// else asked of SQS, else created as Kombu creates it.
func (s *SQS) queueURL(ctx context.Context, name string) (string, error) {
	s.qmu.Lock()
	u, ok := s.queues[name]
	s.qmu.Unlock()
	if ok {
		return u, nil
	}
	if len(s.url.PredefinedQueues) > 0 {
		u, ok := s.url.PredefinedQueues[name]
		if !ok {
			return "", fmt.Errorf("sqs: queue %q is not in predefined_queues, which lists every queue beatd may send to and creates none (Kombu raises UndefinedQueueException the same)", name)
		}
		return u, nil
	}
	got, err := s.client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err == nil {
		u = aws.ToString(got.QueueUrl)
	} else {
		if !isMissingQueue(err) {
			return "", s.explain(fmt.Sprintf("look up queue %q", name), err)
		}
		attrs := map[string]string{"VisibilityTimeout": kombuVisibilityTimeout}
		if strings.HasSuffix(name, ".fifo") {
			attrs["FifoQueue"] = "true"
		}
		created, err := s.client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
		if err != nil {
			return "", s.explain(fmt.Sprintf("queue %q does not exist, and creating it as Kombu does failed", name), err)
		}
		u = aws.ToString(created.QueueUrl)
		s.log.Info("created SQS queue as Kombu would", "queue", name, "url", u)
	}
	s.qmu.Lock()
	s.queues[name] = u
	s.qmu.Unlock()
	return u, nil
}

// isMissingQueue reports whether err is SQS's "no such queue": the JSON
// protocol's QueueDoesNotExist, or the query protocol's code, which SQS
// also sends in x-amzn-query-error and an emulator may send alone.
func isMissingQueue(err error) bool {
	var missing *types.QueueDoesNotExist
	if errors.As(err, &missing) {
		return true
	}
	var ae smithy.APIError
	return errors.As(err, &ae) && (ae.ErrorCode() == "AWS.SimpleQueueService.NonExistentQueue" || ae.ErrorCode() == "QueueDoesNotExist")
}
