package console

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/beatd/beatd/auth"
)

// The console's pages, its event stream and the leader's data carry
// entries' args and kwargs, the audit trail and backfills, so they need
// the read role whenever the entries API does: the one check is
// auth.Tokens.Check. A browser cannot put a token in a page load's or an
// EventSource's headers, so the sign-in form (POST /console/login) puts
// it in an HttpOnly, SameSite=Strict cookie that is good for reads only.
// Actions still send the token as a bearer header from the page's
// script, and the cross-origin check (Secure) still guards every POST,
// sign-in included.

// maxLoginBody bounds the sign-in form.
const maxLoginBody = 8 << 10

// guard serves h to a request holding the read role; it refuses others
// with refuse.
func (s *Server) guard(h http.HandlerFunc, refuse func(http.ResponseWriter, *http.Request, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.cfg.Tokens.Check(r, auth.RoleRead); err != nil {
			refuse(w, r, err)
			return
		}
		// A standby asks the leader for its data as the viewer.
		h(w, r.WithContext(auth.WithCredential(r.Context(), r)))
	}
}

// page guards a console page: a refused viewer gets the sign-in form,
// with the refusal's status.
func (s *Server) page(h http.HandlerFunc) http.HandlerFunc {
	return s.guard(h, func(w http.ResponseWriter, r *http.Request, err error) {
		s.writeLogin(w, r, auth.Status(err), refusalText(err), r.URL.RequestURI())
	})
}

// data guards what a script reads (the event stream, the leader's data):
// a refusal is plain text.
func (s *Server) data(h http.HandlerFunc) http.HandlerFunc {
	return s.guard(h, func(w http.ResponseWriter, r *http.Request, err error) {
		code := auth.Status(err)
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="beatd"`)
		}
		http.Error(w, err.Error(), code)
	})
}

// refusalText is what the sign-in form says about a refused page view.
func refusalText(err error) string {
	if auth.Status(err) == http.StatusUnauthorized {
		return "" // not signed in: the form says what to do
	}
	return err.Error()
}

// loginPage is the sign-in form's data. It holds nothing of the cluster.
type loginPage struct {
	Title string
	Next  string
	Error string
}

func (s *Server) writeLogin(w http.ResponseWriter, r *http.Request, code int, msg, next string) {
	html, err := s.render("login", loginPage{Title: "beatd: sign in", Next: safeNext(next), Error: msg})
	if err != nil {
		s.log.Error("render login", "err", err)
		http.Error(w, "console: internal error", http.StatusInternalServerError)
		return
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="beatd"`)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(html))
}

// serveLoginForm shows the sign-in form.
func (s *Server) serveLoginForm(w http.ResponseWriter, r *http.Request) {
	s.writeLogin(w, r, http.StatusOK, "", r.URL.Query().Get("next"))
}

// login checks the token of the sign-in form and, when it is known,
// sets the cookie and goes on to the page asked for.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		s.writeLogin(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error(), "/")
		return
	}
	next := r.PostForm.Get("next")
	tok := strings.TrimSpace(r.PostForm.Get("token"))
	who, ok := s.cfg.Tokens.Who(tok)
	if !ok {
		s.writeLogin(w, r, http.StatusUnauthorized, "That token is unknown to this replica.", next)
		return
	}
	auth.SetCookie(w, r, tok)
	s.log.Info("console sign-in", "actor", who.Name, "role", who.Role.String())
	http.Redirect(w, r, safeNext(next), http.StatusSeeOther)
}

// logout clears the cookie.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	auth.ClearCookie(w, r)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// signedIn reports whether r carries the console's cookie.
func signedIn(r *http.Request) bool {
	_, err := r.Cookie(auth.CookieName)
	return err == nil
}

// safeNext is where to go after signing in: a path of this origin, else
// the overview. "//host" and "/\host" would leave the origin.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(u.Path, "/") ||
		strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.HasPrefix(u.Path, "/console/") {
		return "/"
	}
	if u.RawQuery != "" {
		return u.EscapedPath() + "?" + u.RawQuery
	}
	return u.EscapedPath()
}
