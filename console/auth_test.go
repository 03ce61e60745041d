package console

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/store"
)

// readTokens is a tokens file with a reader and an operator, as
// --tokens-file gives it: reads are guarded.
func readTokens(t *testing.T) *auth.Tokens {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	doc := "tokens:\n  reader: {role: read, sha256: " + auth.Hash("tok-reader") + "}\n  ops: {role: operate, sha256: " + auth.Hash("tok-ops") + "}\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := auth.New(auth.Options{File: p})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// fetch GETs path with the client and returns the status and the start
// of the body (a stream is cut after its first bytes).
func fetch(t *testing.T, c *http.Client, base, path, token string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := make([]byte, 64<<10)
	n, _ := io.ReadAtLeast(resp.Body, b, 1)
	return resp.StatusCode, string(b[:n])
}

// TestConsoleReadAuth: with reads guarded, every console page, the event
// stream and the leader's data need the read role, from a bearer token
// or the sign-in cookie; without a token they are 401 and show nothing
// of the schedule. Unguarded, they stay open.
func TestConsoleReadAuth(t *testing.T) {
	const secret = "kwarg-secret-4711"
	e := every("tick", "tasks.tick", 5*time.Second)
	e.Args = []any{secret}
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{e}}
	state := &store.EntryState{Name: "tick", LastSlot: time.Now().Add(-time.Second).UTC().Truncate(time.Second)}
	tk := readTokens(t)
	_, hs := testServerWith(t, func(c *Config) { c.Tokens = tk; c.Term = func() int64 { return 9 } }, cfg, state)
	paths := []string{"/", "/?q=tick", "/entry/tick", "/console/events?view=overview", "/console/events?view=entry&name=tick", "/console/leader.json?term=9",
		"/console/rows.json?limit=10", "/console/rows.json?name=tick"}

	t.Run("no token", func(t *testing.T) {
		for _, p := range paths {
			code, body := fetch(t, hs.Client(), hs.URL, p, "")
			if code != http.StatusUnauthorized {
				t.Errorf("GET %s without a token: %d, want 401", p, code)
			}
			if strings.Contains(body, secret) || strings.Contains(body, "tasks.tick") {
				t.Errorf("GET %s without a token shows the schedule:\n%s", p, body)
			}
		}
	})
	t.Run("unknown token", func(t *testing.T) {
		for _, p := range paths {
			if code, _ := fetch(t, hs.Client(), hs.URL, p, "tok-nobody"); code != http.StatusUnauthorized {
				t.Errorf("GET %s with an unknown token: %d, want 401", p, code)
			}
		}
	})
	t.Run("read token", func(t *testing.T) {
		for _, p := range paths {
			code, body := fetch(t, hs.Client(), hs.URL, p, "tok-reader")
			if code != http.StatusOK {
				t.Errorf("GET %s with a read token: %d, want 200: %s", p, code, body)
			}
		}
		if _, body := fetch(t, hs.Client(), hs.URL, "/entry/tick", "tok-reader"); !strings.Contains(body, secret) {
			t.Errorf("the entry page does not show the args to a reader")
		}
	})
	t.Run("static stays open", func(t *testing.T) {
		if code, _ := fetch(t, hs.Client(), hs.URL, "/console/static/console.css", ""); code != http.StatusOK {
			t.Errorf("static asset: %d", code)
		}
	})
	t.Run("sign in with the form", func(t *testing.T) {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		code, body := fetch(t, c, hs.URL, "/entry/tick", "")
		if code != http.StatusUnauthorized || !strings.Contains(body, `action="/console/login"`) || !strings.Contains(body, `value="/entry/tick"`) {
			t.Fatalf("a page without a token is not the sign-in form (%d):\n%s", code, body)
		}
		post := func(form url.Values, headers map[string]string) *http.Response {
			t.Helper()
			req, _ := http.NewRequest(http.MethodPost, hs.URL+"/console/login", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, v := range headers {
				req.Header.Set(k, v)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp
		}
		if resp := post(url.Values{"token": {"tok-nobody"}, "next": {"/entry/tick"}}, nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
			t.Errorf("an unknown token signs in: %d %v", resp.StatusCode, resp.Cookies())
		}
		if resp := post(url.Values{"token": {"tok-reader"}}, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}); resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
			t.Errorf("a cross-site sign-in is not refused: %d %v", resp.StatusCode, resp.Cookies())
		}
		resp := post(url.Values{"token": {"tok-reader"}, "next": {"/entry/tick"}}, map[string]string{"Sec-Fetch-Site": "same-origin"})
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/entry/tick" {
			t.Fatalf("sign-in: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
		}
		ck := resp.Cookies()
		if len(ck) != 1 || ck[0].Name != auth.CookieName || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode || strings.Contains(ck[0].Value, "tok-reader") {
			t.Fatalf("sign-in cookie %+v", ck)
		}
		for _, p := range paths {
			if code, body := fetch(t, c, hs.URL, p, ""); code != http.StatusOK {
				t.Errorf("GET %s signed in: %d, want 200: %s", p, code, body)
			}
		}
		if _, body := fetch(t, c, hs.URL, "/", ""); !strings.Contains(body, `action="/console/logout"`) {
			t.Errorf("a signed-in page offers no sign-out")
		}
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/console/logout", nil)
		if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("sign-out: %v %v", resp, err)
		}
		if code, _ := fetch(t, c, hs.URL, "/entry/tick", ""); code != http.StatusUnauthorized {
			t.Errorf("after sign-out: %d, want 401", code)
		}
	})
}

// TestConsoleOpenWithoutReadTokens: with no tokens, or only the admin
// token, the console is open as before.
func TestConsoleOpenWithoutReadTokens(t *testing.T) {
	admin, err := auth.New(auth.Options{Admin: "adm"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{every("tick", "tasks.tick", 5*time.Second)}}
	for name, tk := range map[string]*auth.Tokens{"no tokens": nil, "admin token only": admin} {
		t.Run(name, func(t *testing.T) {
			_, hs := testServerWith(t, func(c *Config) { c.Tokens = tk }, cfg)
			for _, p := range []string{"/", "/entry/tick", "/console/events?view=overview"} {
				if code, body := fetch(t, hs.Client(), hs.URL, p, ""); code != http.StatusOK {
					t.Errorf("GET %s: %d, want 200: %s", p, code, body)
				}
			}
		})
	}
}

// TestStandbyAsksLeaderAsViewer: a standby asks the leader for its data
// with the viewer's token, so the leader's guard lets the viewer in and
// no one else.
func TestStandbyAsksLeaderAsViewer(t *testing.T) {
	got := make(chan string, 1)
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		_, _ = w.Write([]byte(`{"backlog": 3, "backlog_ok": true}`))
	}))
	defer leader.Close()
	s := &Server{http: leaderClient(nil)}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer tok-reader")
	ctx := auth.WithCredential(context.Background(), r)
	d, err := s.askLeader(ctx, election.Leader{ID: "l", Token: 4}, []election.Replica{{ID: "l", HTTP: leader.URL}}, nil)
	if err != nil || d.Backlog != 3 {
		t.Fatalf("askLeader: %+v, %v", d, err)
	}
	if h := <-got; h != "Bearer tok-reader" {
		t.Errorf("the leader was asked with %q, want the viewer's token", h)
	}
}

func TestSafeNext(t *testing.T) {
	tests := []struct{ in, want string }{
		{in: "/entry/tick", want: "/entry/tick"},
		{in: "/?q=a&in=name", want: "/?q=a&in=name"},
		{in: "/entry/a%2Fb", want: "/entry/a%2Fb"},
		{in: "", want: "/"},
		{in: "//evil.example/x", want: "/"},
		{in: "/\\evil.example", want: "/"},
		{in: "https://evil.example/", want: "/"},
		{in: "javascript:alert(1)", want: "/"},
		{in: "entry/tick", want: "/"},
		{in: "/console/logout", want: "/"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := safeNext(tt.in); got != tt.want {
				t.Errorf("safeNext(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestRevokedTokenEndsStream: a live stream opened with a token ends
// soon after the token is revoked from the tokens file, and the
// browser's reconnect is refused.
func TestRevokedTokenEndsStream(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tokens:\n  reader: {role: read, sha256: " + auth.Hash("tok-reader") + "}\n")
	tk, err := auth.New(auth.Options{File: p})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{File: "s.yaml", Entries: []*config.Entry{every("tick", "tasks.tick", 5*time.Second)}}
	_, hs := testServerWith(t, func(c *Config) { c.Tokens = tk }, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/console/events?view=overview", nil)
	req.Header.Set("Authorization", "Bearer tok-reader")
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	b := make([]byte, 1)
	if _, err := resp.Body.Read(b); err != nil {
		t.Fatal(err)
	}
	write("tokens:\n  someone-else: {role: read, sha256: " + auth.Hash("tok-other") + "}\n")
	revoked := time.Now()
	_, err = io.Copy(io.Discard, resp.Body)
	if err != nil || ctx.Err() != nil {
		t.Fatalf("the stream did not end after the token was revoked: %v", err)
	}
	if took := time.Since(revoked); took > 5*time.Second {
		t.Errorf("the stream ended %s after the revocation, want within a few seconds", took)
	}
	if code, _ := fetch(t, hs.Client(), hs.URL, "/console/events?view=overview", "tok-reader"); code != http.StatusUnauthorized {
		t.Errorf("reconnect with the revoked token: %d, want 401", code)
	}
}
