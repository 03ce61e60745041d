package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/beatd/beatd/sources"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdEntries writes entries to a real etcd as the daemon's backend does
// (sources.Entries, one transaction), without the validation.
type etcdEntries struct {
	EntriesBackend
	s *sources.Entries
}

func (e etcdEntries) PutEntries(ctx context.Context, docs []EntryDoc, ifMatch map[string]int64) (int64, error) {
	out := make([]sources.Doc, len(docs))
	for i, d := range docs {
		out[i] = sources.Doc{Name: d.Name, Data: d.Spec}
	}
	return e.s.Put(ctx, out, ifMatch)
}

// applyBody is an apply of n entries whose args make it about size bytes.
func applyBody(n, size int) string {
	pad := strings.Repeat("x", max(0, size/n-80))
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"entry-%04d": {"task": "t", "every": 60, "args": [%q]}`, i, pad)
	}
	return `{"entries": {` + strings.Join(parts, ",") + `}}`
}

// TestBodyLimitsMatchEtcd: against a real etcd at its default
// --max-request-bytes, an apply up to MaxApplyBody is taken, a larger
// one is a 413 naming the limit, and etcd refusing a write for its size
// (an etcd run with a lower limit, a prefix of huge keys) is a 413 too,
// with no gRPC text in any answer.
func TestBodyLimitsMatchEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an embedded etcd")
	}
	srv := testutil.MustStartEmbeddedEtcd(t)
	cli := testutil.NewEtcdClient(t, srv.Endpoints...)
	h := Handler(Config{Backend: &fakeBackend{}, Gatherer: prometheus.NewRegistry(),
		Entries: etcdEntries{s: sources.NewEntries(cli, "/beatd/limits/")}, Tokens: adminOnly(t, "adm")})
	post := func(t *testing.T, path, body string) *httptest.ResponseRecorder {
		t.Helper()
		method := "POST"
		if !strings.HasSuffix(path, "/entries") {
			method = "PUT"
		}
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer adm")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	check413 := func(t *testing.T, rec *httptest.ResponseRecorder, limit int64, says string) {
		t.Helper()
		if rec.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413: %s", rec.Code, rec.Body)
		}
		var got struct {
			Errors   []struct{ Message string } `json:"errors"`
			MaxBytes int64                      `json:"max_bytes"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || len(got.Errors) != 1 {
			t.Fatalf("413 body %s: %v", rec.Body, err)
		}
		if got.MaxBytes != limit || !strings.Contains(got.Errors[0].Message, says) {
			t.Errorf("413 says %q with max_bytes %d, want %q and %d", got.Errors[0].Message, got.MaxBytes, says, limit)
		}
	}
	noGRPC := func(t *testing.T, rec *httptest.ResponseRecorder) {
		t.Helper()
		for _, leak := range []string{"rpc error", "etcdserver", "grpc", "code ="} {
			if strings.Contains(rec.Body.String(), leak) {
				t.Errorf("the answer leaks %q: %s", leak, rec.Body)
			}
		}
	}

	t.Run("an apply at the limit is taken by etcd", func(t *testing.T) {
		body := applyBody(MaxApplyEntries, MaxApplyBody-4096)
		if len(body) > MaxApplyBody || len(body) < MaxApplyBody-16<<10 {
			t.Fatalf("body of %d bytes, want just under %d", len(body), MaxApplyBody)
		}
		if rec := post(t, "/api/v1/entries", body); rec.Code != http.StatusOK {
			t.Fatalf("apply of %d bytes: %d: %s", len(body), rec.Code, rec.Body)
		}
	})
	t.Run("1.8 MB apply", func(t *testing.T) {
		rec := post(t, "/api/v1/entries", applyBody(100, 1_800_000))
		check413(t, rec, MaxApplyBody, "larger than 1 MiB (1048576 bytes)")
		noGRPC(t, rec)
	})
	t.Run("one entry over 64 KiB", func(t *testing.T) {
		rec := post(t, "/api/v1/entries/big", `{"task": "t", "every": 60, "args": ["`+strings.Repeat("x", 70<<10)+`"]}`)
		check413(t, rec, MaxEntryBody, "larger than 64 KiB")
	})
	// Under the body limit, but not under etcd's once the keys are added:
	// a long prefix on each of 128 keys. 5 KiB makes a transaction of
	// ~1.7 MB, which etcd refuses ("request is too large"); 12 KiB one of
	// ~2.6 MB, which the gRPC client refuses to send.
	for _, prefix := range []int{5 << 10, 12 << 10} {
		t.Run(fmt.Sprintf("etcd refuses the size, prefix %d", prefix), func(t *testing.T) {
			h := Handler(Config{Backend: &fakeBackend{}, Gatherer: prometheus.NewRegistry(),
				Entries: etcdEntries{s: sources.NewEntries(cli, "/"+strings.Repeat("p", prefix)+"/")}, Tokens: adminOnly(t, "adm")})
			req := httptest.NewRequest("POST", "/api/v1/entries", strings.NewReader(applyBody(MaxApplyEntries, MaxApplyBody-4096)))
			req.Header.Set("Authorization", "Bearer adm")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			check413(t, rec, EtcdMaxRequestBytes, "larger than etcd takes in one request")
			noGRPC(t, rec)
		})
	}
}

func TestSizeText(t *testing.T) {
	for n, want := range map[int64]string{1 << 20: "1 MiB", 3 << 19: "1.5 MiB", 64 << 10: "64 KiB", 1000: "1000 bytes"} {
		if got := sizeText(n); got != want {
			t.Errorf("sizeText(%d) = %q, want %q", n, got, want)
		}
	}
}

type failingEntries struct {
	EntriesBackend
	err error
}

func (f failingEntries) PutEntries(context.Context, []EntryDoc, map[string]int64) (int64, error) {
	return 0, f.err
}

// TestEtcdErrorsNotLeaked: an etcd failure is a 503 with a short reason;
// the gRPC text stays in the log.
func TestEtcdErrorsNotLeaked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		code int
		says string
	}{
		{"unavailable", fmt.Errorf("entries: put: %w", status.Error(codes.Unavailable, "connection error: desc = \"transport: dial tcp 10.0.0.1:2379\"")), 503, "etcd is unavailable"},
		{"no space", fmt.Errorf("entries: put: %w", rpctypes.ErrNoSpace), 503, "out of space"},
		{"deadline", fmt.Errorf("entries: put: %w", context.DeadlineExceeded), 503, "did not answer in time"},
		{"too large", fmt.Errorf("entries: put: %w", rpctypes.ErrRequestTooLarge), 413, "larger than etcd takes"},
		{"beatd's own", errors.New("entries: the merger is closed"), 503, "the merger is closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := Handler(Config{Backend: &fakeBackend{}, Gatherer: prometheus.NewRegistry(), Entries: failingEntries{err: tt.err}, Tokens: adminOnly(t, "adm")})
			req := httptest.NewRequest("PUT", "/api/v1/entries/e", strings.NewReader(`{"task":"t","every":1}`))
			req.Header.Set("Authorization", "Bearer adm")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.says) {
				t.Errorf("%d %s, want %d saying %q", rec.Code, rec.Body, tt.code, tt.says)
			}
			for _, leak := range []string{"rpc error", "etcdserver", "transport", "10.0.0.1"} {
				if strings.Contains(rec.Body.String(), leak) {
					t.Errorf("the answer leaks %q: %s", leak, rec.Body)
				}
			}
		})
	}
}
