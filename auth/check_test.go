package auth

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestCheck: the one decision for every route, with a bearer header or
// the console's cookie, which counts for reads only.
func TestCheck(t *testing.T) {
	guarded, err := New(Options{Admin: "adm", Read: "rd"})
	if err != nil {
		t.Fatal(err)
	}
	adminOnly, err := New(Options{Admin: "adm"})
	if err != nil {
		t.Fatal(err)
	}
	cookie := func(tok string) *http.Cookie {
		rec := httptest.NewRecorder()
		SetCookie(rec, httptest.NewRequest("POST", "/console/login", nil), tok)
		return rec.Result().Cookies()[0]
	}
	tests := []struct {
		name   string
		tokens *Tokens
		need   Role
		bearer string
		cookie *http.Cookie
		want   error
	}{
		{name: "guarded read, no token", tokens: guarded, need: RoleRead, want: ErrNoToken},
		{name: "guarded read, bearer", tokens: guarded, need: RoleRead, bearer: "rd"},
		{name: "guarded read, cookie", tokens: guarded, need: RoleRead, cookie: cookie("rd")},
		{name: "guarded read, bad cookie", tokens: guarded, need: RoleRead, cookie: &http.Cookie{Name: CookieName, Value: "%%%"}, want: ErrNoToken},
		{name: "guarded read, unknown cookie", tokens: guarded, need: RoleRead, cookie: cookie("nope"), want: ErrNoToken},
		{name: "operate with an admin cookie", tokens: guarded, need: RoleOperate, cookie: cookie("adm"), want: ErrNoToken},
		{name: "operate with a read bearer", tokens: guarded, need: RoleOperate, bearer: "rd", want: ErrRole},
		{name: "operate with the admin bearer", tokens: guarded, need: RoleOperate, bearer: "adm"},
		{name: "open read (admin token only)", tokens: adminOnly, need: RoleRead},
		{name: "open read (no tokens)", tokens: nil, need: RoleRead},
		{name: "action with no tokens", tokens: nil, need: RoleOperate, bearer: "adm", want: ErrNoTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			if tt.bearer != "" {
				r.Header.Set("Authorization", "Bearer "+tt.bearer)
			}
			if tt.cookie != nil {
				r.AddCookie(tt.cookie)
			}
			_, err := tt.tokens.Check(r, tt.need)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Check: %v, want %v", err, tt.want)
			}
			if err != nil && Status(err) != map[error]int{ErrNoToken: 401, ErrRole: 403, ErrNoTokens: 403}[tt.want] {
				t.Errorf("Status(%v) = %d", err, Status(err))
			}
		})
	}
}
