package sqs

import (
	"context"
	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"strings"
	"testing"
	"time"
)

// TestCheckAtStart: the start-up check's clear errors, against the
// emulator where it can tell (a queue not in predefined_queues, an
// exchange Kombu cannot route on SQS) and the AWS chain itself (no
// credentials, a region whose endpoint does not resolve); a missing
// queue is created as Kombu creates it.
func TestCheckAtStart(t *testing.T) {
	e := sharedSQS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	etcd := sharedEtcd(t)
	check := func(url string, yaml string) error {
		s, err := New(ctx, Options{URL: url, Etcd: etcd})
		if err != nil {
			return err
		}
		return s.Check(ctx, compile(t, yaml))
	}
	q := uniq("chk")
	if err := check(e.BrokerURL(), "    {task: tasks.add, every: 1s, options: {queue: "+q+".daily}}"); err != nil {
		t.Errorf("a missing queue is created as Kombu does: %v", err)
	}
	c := awssqs.New(awssqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(e.Endpoint()), Credentials: aws.AnonymousCredentials{}})
	if _, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q + "-daily")}); err != nil {
		t.Errorf("queue %s-daily not created: %v", q, err)
	}
	if got := drain(t, e, q+"-daily"); len(got) != 0 {
		t.Errorf("the check sent %d messages", len(got))
	}
	for _, tt := range []struct {
		name, url, entry, want string
		env                    map[string]string
	}{
		{name: "not predefined", url: e.BrokerURL() + "&predefined_queues=celery=" + e.QueueURL("celery"),
			entry: "    {task: tasks.add, every: 1s, options: {queue: reports}}", want: `queue "reports" is not in predefined_queues`},
		{name: "exchange", url: e.BrokerURL(),
			entry: "    {task: tasks.add, every: 1s, options: {exchange: mail, routing_key: mail.send}}", want: "cannot be routed on SQS"},
		{name: "no credentials", url: e.BrokerURL(), entry: "    {task: tasks.add, every: 1s}", want: "no AWS credentials from the standard chain",
			env: map[string]string{"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_PROFILE": "",
				"AWS_SHARED_CREDENTIALS_FILE": t.TempDir() + "/none", "AWS_CONFIG_FILE": t.TempDir() + "/none"}},
		{name: "region without endpoint", url: "sqs://?region=xx-nowhere-9", entry: "    {task: tasks.add, every: 1s}",
			want: `region "xx-nowhere-9" has no SQS endpoint that resolves`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			err := check(tt.url, tt.entry)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one with %q", err, tt.want)
			}
		})
	}
}

// TestPing: readiness asks SQS something the sender's credentials may do:
// a queue list, or with predefined_queues one queue's attributes.
func TestPing(t *testing.T) {
	e := sharedSQS(t)
	ctx := context.Background()
	for _, url := range []string{e.BrokerURL(), e.BrokerURL() + "&predefined_queues=celery=" + e.QueueURL(uniq("nope"))} {
		s, err := New(ctx, Options{URL: url, Etcd: sharedEtcd(t)})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Ping(ctx)
		if strings.Contains(url, "predefined") {
			if err == nil {
				t.Errorf("%s: ping of a queue that does not exist passed", url)
			}
		} else if err != nil {
			t.Errorf("%s: %v", url, err)
		}
	}
	s, err := New(ctx, Options{URL: "sqs://127.0.0.1:1?region=us-east-1", Etcd: sharedEtcd(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err == nil {
		t.Error("ping of an endpoint that does not answer passed")
	}
}
