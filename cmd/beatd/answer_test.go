package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestErrorsGiveTheServersReason: every error answer of the API prints
// its reason, whatever the body's shape, through the one HTTP helper;
// `beatd backfill` of a future range shows the server's 422 reason.
func TestErrorsGiveTheServersReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		ctype  string
		body   string
		want   []string
	}{
		{name: "422 with field errors", status: http.StatusUnprocessableEntity, ctype: "application/json",
			body: `{"errors":[{"pointer":"/to","message":"to is in the future: a backfill publishes only past slots"}]}`,
			want: []string{"422 Unprocessable Entity", "/to: to is in the future: a backfill publishes only past slots"}},
		{name: "422 without a pointer", status: http.StatusUnprocessableEntity, ctype: "application/json",
			body: `{"errors":[{"pointer":"","message":"from is after to"}]}`,
			want: []string{"422 Unprocessable Entity", "from is after to"}},
		{name: "error key", status: http.StatusServiceUnavailable, ctype: "application/json",
			body: `{"error":"etcd: no leader"}`, want: []string{"503 Service Unavailable", "etcd: no leader"}},
		{name: "plain text", status: http.StatusServiceUnavailable, ctype: "text/plain",
			body: "entries: list: context deadline exceeded\n", want: []string{"503 Service Unavailable", "entries: list: context deadline exceeded"}},
		{name: "no body", status: http.StatusForbidden, want: []string{"403 Forbidden", "the server gave no reason"}},
		{name: "hostile reason", status: http.StatusUnprocessableEntity, ctype: "application/json",
			body: `{"errors":[{"pointer":"/note","message":"bad\u001b[2J\u009bnote"}]}`, want: []string{`bad\x1b[2J\u009bnote`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.ctype != "" {
					w.Header().Set("Content-Type", tc.ctype)
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), []string{"backfill", "nightly", "--from", "2016-05-19T10:00:00Z", "--to", "2999-01-01T00:00:00Z",
				"--server", srv.URL}, &stdout, &stderr)
			if code == 0 {
				t.Fatalf("exit 0 on a %d answer", tc.status)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			checkTerminalSafe(t, stderr.String(), true)
		})
	}
}

// TestErrorNamesTheServer: with no beatd at --server (the default
// 127.0.0.1:8080 included), the error names the address and the flag
// that sets it, not only "dial tcp".
func TestErrorNamesTheServer(t *testing.T) {
	t.Parallel()
	server := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	for _, args := range [][]string{
		{"entries", "list", "--server", server},
		{"backfill", "nightly", "--from", "2016-05-19T10:00:00Z", "--to", "2016-05-19T11:00:00Z", "--server", server},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code == 0 {
			t.Fatalf("%v: exit 0 with no server", args)
		}
		for _, w := range []string{"no answer from beatd at " + server, "--server or BEATD_SERVER"} {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%v: stderr lacks %q:\n%s", args, w, stderr.String())
			}
		}
	}
}
