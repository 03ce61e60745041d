package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// The reasons Check refuses a request; each maps to one HTTP status
// (Status).
var (
	// ErrNoTokens: the request needs a role and this replica has no
	// token at all, so nothing can hold one (403).
	ErrNoTokens = errors.New("auth: no tokens are configured")
	// ErrNoToken: no token was sent, or it is unknown (401).
	ErrNoToken = errors.New("auth: missing or unknown token")
	// ErrRole: the token's role is below the one needed (403).
	ErrRole = errors.New("auth: role too low")
)

// Refusal is why Check refused a request: one of the sentinels above,
// with the role needed and who asked. Its message says what to do.
type Refusal struct {
	Err  error
	Need Role
	Who  Identity
}

func (e *Refusal) Error() string {
	switch e.Err {
	case ErrNoTokens:
		return "this needs the " + e.Need.String() + " role, and no tokens are configured: set --tokens-file (or --admin-token-file / BEATD_ADMIN_TOKEN)"
	case ErrNoToken:
		return "missing or unknown bearer token (this needs the " + e.Need.String() + " role)"
	default:
		return fmt.Sprintf("token %q has the %s role; this needs %s", e.Who.Name, e.Who.Role, e.Need)
	}
}

func (e *Refusal) Unwrap() error { return e.Err }

// Status is the HTTP status of a refusal from Check: 401 for a missing
// or unknown token, else 403.
func Status(err error) int {
	if errors.Is(err, ErrNoToken) {
		return http.StatusUnauthorized
	}
	return http.StatusForbidden
}

// CookieName is the console's sign-in cookie. It holds a token (base64),
// is HttpOnly and SameSite=Strict, and grants reads only: every action
// still needs the token in the Authorization header, which a page of
// another site cannot set.
const CookieName = "beatd_token"

// Check is the one decision of whether r may do what needs role need,
// for the API and the console alike. Reads are open unless Guarded (who
// is then the token's, if one was sent); every other role needs a token
// holding it, sent as "Authorization: Bearer TOKEN". A read may also
// present the token in the console's cookie. A refusal is a *Refusal.
func (t *Tokens) Check(r *http.Request, need Role) (Identity, error) {
	who, ok := t.fromRequest(r, need)
	if need <= RoleRead && !t.Guarded() {
		return who, nil
	}
	if !t.Enabled() {
		return Identity{}, &Refusal{Err: ErrNoTokens, Need: need}
	}
	if !ok {
		return Identity{}, &Refusal{Err: ErrNoToken, Need: need}
	}
	if !who.Allows(need) {
		return who, &Refusal{Err: ErrRole, Need: need, Who: who}
	}
	return who, nil
}

func (t *Tokens) fromRequest(r *http.Request, need Role) (Identity, bool) {
	tok := Credential(r, need)
	if tok == "" {
		return Identity{}, false
	}
	return t.Who(tok)
}

// Credential is the token r presents for role need: the bearer token,
// else, for a read, the console's cookie; "" when none.
func Credential(r *http.Request, need Role) string {
	if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(got)
	}
	if need > RoleRead {
		return ""
	}
	c, err := r.Cookie(CookieName)
	if err != nil {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return ""
	}
	return string(b)
}

// SetCookie signs the browser in with token: the cookie lasts for the
// browser session, is sent only to this origin's pages (SameSite=Strict),
// is never readable by script (HttpOnly), and over HTTPS only when the
// request came over HTTPS.
func SetCookie(w http.ResponseWriter, r *http.Request, token string) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: base64.RawURLEncoding.EncodeToString([]byte(token)), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// ClearCookie signs the browser out.
func ClearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// credKey carries the token a request presented in its context, so a
// replica that asks another for data on its behalf asks as the same
// caller, and the other's guard lets in whom this one's did.
type credKey struct{}

// WithCredential returns ctx carrying the token r presents for a read
// (Credential), if any.
func WithCredential(ctx context.Context, r *http.Request) context.Context {
	if tok := Credential(r, RoleRead); tok != "" {
		return context.WithValue(ctx, credKey{}, tok)
	}
	return ctx
}

// Forward sends req with the token ctx carries (WithCredential), if any.
func Forward(ctx context.Context, req *http.Request) {
	if tok, _ := ctx.Value(credKey{}).(string); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
}
