package sqs

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeSQS answers every request with the replies in turn (the last one
// repeats): these tests are about parsing SQS's own JSON replies, which
// the emulator cannot produce (it never throttles, fails or rejects a
// credential, and its raw batch reply is misnamed).
func fakeSQS(t *testing.T, replies ...string) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		i := int(n.Add(1)) - 1
		reply := replies[min(i, len(replies)-1)]
		status, body, _ := strings.Cut(reply, " ")
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		if status != "200" {
			w.WriteHeader(400)
		}
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func fakeDispatcher(t *testing.T, endpoint string) *SQS {
	t.Helper()
	s, err := New(context.Background(), Options{URL: "sqs://?region=eu-west-1&endpoint_url=" + endpoint, Etcd: sharedEtcd(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testMessages(n int) []*message {
	var out []*message
	for i := range n {
		out = append(out, &message{ID: "id" + string(rune('a'+i)), Entry: "e", Queue: "q", URL: "https://sqs.eu-west-1.amazonaws.com/1/q", Body: "eyJ9"}) // MD5 cf79a32b04e926e176bae6d2f34f45f4, which the SDK checks
	}
	return out
}

// TestBatchReplyAsSQSWritesIt: SQS's SendMessageBatch reply (Successful
// and Failed, as AWS documents it) gives each entry its outcome; a
// sender-fault failure is final, SQS's own side is retried and counted;
// a reply that names no entry (goaws 0.5.4's raw JSON) leaves them
// unknown, with an error that says so.
func TestBatchReplyAsSQSWritesIt(t *testing.T) {
	real := `200 {"Successful":[{"Id":"0","MessageId":"0a5231c7-8bff-4955-be2e-8dc7c50a25fa","MD5OfMessageBody":"cf79a32b04e926e176bae6d2f34f45f4"}],` +
		`"Failed":[{"Id":"1","SenderFault":true,"Code":"InvalidParameterValue","Message":"Message too long"},` +
		`{"Id":"2","SenderFault":false,"Code":"InternalError","Message":"try again"}]}`
	retried := `200 {"Successful":[{"Id":"0","MessageId":"1b5231c7-8bff-4955-be2e-8dc7c50a25fa","MD5OfMessageBody":"cf79a32b04e926e176bae6d2f34f45f4"}],"Failed":[]}`
	srv, calls := fakeSQS(t, real, retried)
	s := fakeDispatcher(t, srv.URL)
	msgs := testMessages(3)
	s.sendBatch(context.Background(), msgs)
	if msgs[0].outcome != sent || msgs[1].outcome != notSent || msgs[2].outcome != sent {
		t.Errorf("outcomes %v %v %v, want sent, not sent, sent (after a retry)", msgs[0].outcome, msgs[1].outcome, msgs[2].outcome)
	}
	if msgs[1].err == nil || !strings.Contains(msgs[1].err.Error(), "InvalidParameterValue: Message too long") {
		t.Errorf("sender fault error: %v", msgs[1].err)
	}
	if calls.Load() != 2 || testutil.ToFloat64(s.Throttled()) != 1 {
		t.Errorf("%d calls, %v counted, want 2 and 1", calls.Load(), testutil.ToFloat64(s.Throttled()))
	}

	srv, _ = fakeSQS(t, `200 {"SendMessageBatchResultEntry":[{"Id":"0","MessageId":"x"}]}`)
	s = fakeDispatcher(t, srv.URL)
	msgs = testMessages(1)
	s.sendBatch(context.Background(), msgs)
	if msgs[0].outcome != unknown || !strings.Contains(msgs[0].err.Error(), "names 0 of its 1 entries") {
		t.Errorf("misnamed reply: %v %v, want unknown", msgs[0].outcome, msgs[0].err)
	}
}

// TestThrottledCallsRetryWithBackoff: a throttled call is retried with
// the project's backoff until SQS takes the batch, and counted.
func TestThrottledCallsRetryWithBackoff(t *testing.T) {
	throttled := `400 {"__type":"com.amazonaws.sqs#RequestThrottled","message":"Rate exceeded"}`
	ok := `200 {"Successful":[{"Id":"0","MessageId":"m0","MD5OfMessageBody":"cf79a32b04e926e176bae6d2f34f45f4"},{"Id":"1","MessageId":"m1","MD5OfMessageBody":"cf79a32b04e926e176bae6d2f34f45f4"}]}`
	srv, calls := fakeSQS(t, throttled, throttled, ok)
	s := fakeDispatcher(t, srv.URL)
	msgs := testMessages(2)
	start := time.Now()
	s.sendBatch(context.Background(), msgs)
	if msgs[0].outcome != sent || msgs[1].outcome != sent {
		t.Fatalf("outcomes %v %v: %v", msgs[0].outcome, msgs[1].outcome, msgs[0].err)
	}
	if calls.Load() != 3 || testutil.ToFloat64(s.Throttled()) != 2 {
		t.Errorf("%d calls, %v throttles counted, want 3 and 2", calls.Load(), testutil.ToFloat64(s.Throttled()))
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("retried after %v: no backoff", took)
	}
}

// TestRejectedCredentialsSayWhat: the credential errors SQS answers name
// the AWS chain, not a bare 403.
func TestRejectedCredentialsSayWhat(t *testing.T) {
	for _, code := range []string{"InvalidClientTokenId", "SignatureDoesNotMatch"} {
		srv, _ := fakeSQS(t, `400 {"__type":"com.amazonaws.sqs#`+code+`","message":"The security token included in the request is invalid."}`)
		s := fakeDispatcher(t, srv.URL)
		err := s.Check(context.Background(), compile(t, "    {task: tasks.add, every: 1s}"))
		if err == nil || !strings.Contains(err.Error(), "AWS rejected the credentials ("+code+")") {
			t.Errorf("%s: %v", code, err)
		}
	}
}
