package sqs

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	for _, tt := range []struct {
		raw     string
		want    URL
		wantErr string
	}{
		{raw: "sqs://", want: URL{Base64: true}},
		{raw: "sqs://?region=eu-west-1&queue_name_prefix=prod-", want: URL{Region: "eu-west-1", QueueNamePrefix: "prod-", Base64: true}},
		{raw: "sqs://localhost:4100", want: URL{Endpoint: "http://localhost:4100", Base64: true}},
		{raw: "sqs://sqs.internal:443?is_secure=true", want: URL{Endpoint: "https://sqs.internal:443", Base64: true}},
		{raw: "sqs://?endpoint_url=https://vpce-1.sqs.eu-west-1.vpce.amazonaws.com/", want: URL{Endpoint: "https://vpce-1.sqs.eu-west-1.vpce.amazonaws.com", Base64: true}},
		{raw: "sqs://?predefined_queues=celery=https://sqs.eu-west-1.amazonaws.com/1/celery,jobs.fifo=https://sqs.eu-west-1.amazonaws.com/1/jobs.fifo",
			want: URL{PredefinedQueues: map[string]string{"celery": "https://sqs.eu-west-1.amazonaws.com/1/celery", "jobs.fifo": "https://sqs.eu-west-1.amazonaws.com/1/jobs.fifo"}, Base64: true}},
		{raw: "sqs://?sqs_base64_encoding=false&visibility_timeout=60", want: URL{}},
		{raw: "sqs://AKIA:secret@", wantErr: "carries credentials"},
		{raw: "sqs://AKIA:secret@localhost:4100", wantErr: "AWS_ACCESS_KEY_ID"},
		{raw: "sqs://?region=Europe", wantErr: `region="Europe" is not an AWS region`},
		{raw: "sqs://?regoin=eu-west-1", wantErr: `unknown option "regoin"`},
		{raw: "sqs://?predefined_queues=celery", wantErr: "is not NAME=QUEUE_URL"},
		{raw: "sqs://host:1?endpoint_url=http://other:2", wantErr: "names an endpoint twice"},
		{raw: "sqs://?endpoint_url=ftp://x", wantErr: "want http(s)://"},
		{raw: "sqs:///celery", wantErr: "unexpected path"},
		{raw: "redis://localhost", wantErr: "want sqs://"},
	} {
		got, err := ParseURL(tt.raw)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want one with %q", tt.raw, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.raw, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.raw, got, tt.want)
		}
	}
	if !IsSQSURL(" SQS://x") || IsSQSURL("sqsx://") {
		t.Error("IsSQSURL")
	}
}
