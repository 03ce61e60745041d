package console_test

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleSignInBrowser: with a read token configured, a real browser
// gets the sign-in form instead of the schedule; after signing in with the
// read token, pages and the live stream (an EventSource, which sends no
// header, only the cookie) work, script cannot read the cookie, and
// signing out brings the form back.
func TestConsoleSignInBrowser(t *testing.T) {
	const readToken = "console-read-token"
	e := startEnvWith(t, 1, "entries:\n  tick: {task: tasks.add, every: 2s, args: [4711, 2]}\n",
		"BEATD_ADMIN_TOKEN="+adminToken, "BEATD_READ_TOKEN="+readToken)
	p := e.procs[0]
	ctx := e.tab(t)

	run(t, ctx, chromedp.Navigate(p.url("/entry/tick")))
	waitJS(t, ctx, 10*time.Second, "the sign-in form", `!!document.getElementById('login-form')`)
	if eval[bool](t, ctx, `document.body.innerText.includes('tasks.add') || document.body.innerText.includes('4711')`) {
		t.Fatal("the sign-in page shows the schedule")
	}
	e.shot(t, ctx, "signin-form")

	// A wrong token: refused, still the form.
	run(t, ctx, chromedp.SetValue(chromedp.ID("#login-token"), "wrong"), chromedp.Click(chromedp.ID("#login-submit")))
	waitJS(t, ctx, 10*time.Second, "the refusal", `(document.getElementById('login-error') || {}).textContent === 'That token is unknown to this replica.'`)

	run(t, ctx, chromedp.SetValue(chromedp.ID("#login-token"), readToken), chromedp.Click(chromedp.ID("#login-submit")))
	waitJS(t, ctx, 10*time.Second, "the entry page", `location.pathname === '/entry/tick' && document.body.innerText.includes('tasks.add')`)
	waitJS(t, ctx, 10*time.Second, "the live stream connected", `document.getElementById('live-state').textContent === 'Live'`)
	waitJS(t, ctx, 10*time.Second, "a live update", `Number(document.body.dataset.updated || 0) > 0`)
	if eval[bool](t, ctx, `document.cookie.includes('beatd_token')`) {
		t.Error("script can read the sign-in cookie: it must be HttpOnly")
	}
	// The token is kept for actions too; a read token's trigger is refused
	// by role, not for a missing token.
	if got := eval[string](t, ctx, `sessionStorage.getItem('beatd-admin-token')`); got != readToken {
		t.Errorf("sessionStorage token %q, want the signed-in one", got)
	}
	e.shot(t, ctx, "signin-entry")

	run(t, ctx, chromedp.Click(chromedp.ID("#logout")))
	waitJS(t, ctx, 10*time.Second, "the sign-in form after signing out", `!!document.getElementById('login-form')`)
	if got := eval[string](t, ctx, `sessionStorage.getItem('beatd-admin-token') || ''`); got != "" {
		t.Errorf("signing out left the token in sessionStorage")
	}
}
