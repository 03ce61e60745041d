// Package auth says who a bearer token belongs to and what it may do:
// named tokens with roles, read from a file of name → SHA-256 hash, so
// no plain token is ever stored.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
)

// Role is what a token may do. Each role includes the ones below it.
type Role int

// The roles, least first.
const (
	RoleNone    Role = iota
	RoleRead         // status, entries, audit, backfill listings
	RoleOperate      // trigger, pause, resume, backfill
	RoleAdmin        // entries: put and delete
)

var roleNames = []string{"", "read", "operate", "admin"}

func (r Role) String() string {
	if r < 0 || int(r) >= len(roleNames) {
		return fmt.Sprintf("role(%d)", int(r))
	}
	return roleNames[r]
}

// ParseRole is the role named s.
func ParseRole(s string) (Role, error) {
	if i := slices.Index(roleNames, s); i > 0 {
		return Role(i), nil
	}
	return RoleNone, fmt.Errorf("unknown role %q (want read, operate or admin)", s)
}

// Identity is who made a request: a token's name and role.
type Identity struct {
	Name string
	Role Role
}

// Allows reports whether the identity holds at least role need.
func (id Identity) Allows(need Role) bool { return id.Role >= need }

// Built-in names: the single tokens of earlier releases keep working
// under them.
const (
	AdminName = "admin" // --admin-token-file / BEATD_ADMIN_TOKEN
	ReadName  = "read"  // --read-token-file / BEATD_READ_TOKEN
)

// Hash is the SHA-256 of a token, as the tokens file holds it. A plain
// hash suffices (no bcrypt): beatd's tokens are 256 random bits, so
// there is no dictionary to try, and a slow hash would cost every request.
func Hash(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// NewToken returns a fresh random token (256 bits, URL-safe).
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail (Go 1.24+)
	return "bt_" + base64.RawURLEncoding.EncodeToString(b)
}

// table is one reading of the tokens: hash → identity.
type table map[[32]byte]Identity

// Tokens answers who a request's bearer token is. It reads the tokens
// file again when the file changes (checked at most once a second, on
// use), so adding or revoking a token needs no restart; a bad file keeps
// the tokens it replaced, and says why in the log.
type Tokens struct {
	path     string
	builtins table
	log      *slog.Logger
	now      func() time.Time

	mu        sync.Mutex
	file      table
	stamp     fileStamp
	checkedAt time.Time
	loadErr   error
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// Options configure Tokens.
type Options struct {
	// File is the tokens file ("" for none).
	File string
	// Admin and Read are the single tokens of earlier releases ("" for
	// none): they are the tokens named admin and read.
	Admin, Read string
	Logger      *slog.Logger
	Now         func() time.Time
}

// New reads the tokens. A bad tokens file is an error naming FILE:LINE:COL.
func New(o Options) (*Tokens, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	t := &Tokens{path: o.File, builtins: table{}, log: o.Logger, now: o.Now}
	if o.Admin != "" {
		t.builtins[sha256.Sum256([]byte(o.Admin))] = Identity{Name: AdminName, Role: RoleAdmin}
	}
	if o.Read != "" {
		t.builtins[sha256.Sum256([]byte(o.Read))] = Identity{Name: ReadName, Role: RoleRead}
	}
	if o.File != "" {
		st, err := os.Stat(o.File)
		if err != nil {
			return nil, fmt.Errorf("tokens file: %w", err)
		}
		f, err := Load(o.File)
		if err != nil {
			return nil, err
		}
		t.file, t.stamp, t.checkedAt = f, fileStamp{st.ModTime(), st.Size()}, o.Now()
		for _, id := range f {
			if id.Name == AdminName && o.Admin != "" {
				return nil, fmt.Errorf("%s: the name %q is the admin token's (--admin-token-file); give this token another name", o.File, AdminName)
			}
		}
	}
	return t, nil
}

// Enabled reports whether any token exists: without one, the actions
// that need a role are disabled.
func (t *Tokens) Enabled() bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.builtins) > 0 || t.path != ""
}

// Guarded reports whether reads need a token: a read token or a tokens
// file is configured. (The admin token alone leaves reads open, as
// before named tokens.)
func (t *Tokens) Guarded() bool {
	if t == nil {
		return false
	}
	for _, id := range t.builtins {
		if id.Role == RoleRead {
			return true
		}
	}
	return t.path != ""
}

// Who returns the identity of a bearer token; ok is false for an unknown
// one.
func (t *Tokens) Who(token string) (Identity, bool) {
	if t == nil || token == "" {
		return Identity{}, false
	}
	h := sha256.Sum256([]byte(token))
	if id, ok := t.builtins[h]; ok {
		return id, true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refreshLocked()
	// The map lookup is on the hash, not the token: its timing says
	// nothing an attacker could use to guess a token.
	id, ok := t.file[h]
	return id, ok
}

// FromRequest returns the identity of r's bearer token.
func (t *Tokens) FromRequest(r *http.Request) (Identity, bool) {
	return t.fromRequest(r, RoleOperate) // the header only
}

// LoadError is why the tokens file's last change was refused (nil when
// the file in use is the one on disk).
func (t *Tokens) LoadError() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refreshLocked()
	return t.loadErr
}

func (t *Tokens) refreshLocked() {
	if t.path == "" {
		return
	}
	now := t.now()
	if now.Sub(t.checkedAt) < time.Second && !now.Before(t.checkedAt) {
		return
	}
	t.checkedAt = now
	st, err := os.Stat(t.path)
	if err != nil {
		if t.loadErr == nil {
			t.log.Error("tokens file unreadable; keeping the tokens read before", "file", t.path, "err", err)
		}
		t.loadErr = err
		return
	}
	stamp := fileStamp{st.ModTime(), st.Size()}
	if stamp == t.stamp {
		return
	}
	t.stamp = stamp
	f, err := Load(t.path)
	if err != nil {
		t.loadErr = err
		t.log.Error("tokens file refused; keeping the tokens read before", "err", err)
		return
	}
	t.file, t.loadErr = f, nil
	t.log.Info("tokens file reloaded", "file", t.path, "tokens", len(f))
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$`)

// CheckName refuses a token name that a tokens file cannot hold.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("token name %q: want 1-64 letters, digits or _.@:- (starting with a letter or digit)", name)
	}
	return nil
}

// Load reads a tokens file:
//
//	tokens:
//	  alice: {role: operate, sha256: <hex of the token's SHA-256>}
//
// Every problem is reported as FILE:LINE:COL: message.
func Load(path string) (table, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	return parse(path, b)
}

func parse(path string, b []byte) (table, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var errs []string
	at := func(n *yaml.Node, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%s:%d:%d: %s", path, n.Line, n.Column, fmt.Sprintf(format, args...)))
	}
	out := table{}
	if len(doc.Content) == 0 {
		return out, nil // an empty file: no tokens
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		at(root, "want a mapping with a tokens key")
		return nil, errors.New(strings.Join(errs, "\n"))
	}
	var toks *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if k.Value != "tokens" {
			at(k, "unknown key %q (want tokens)", k.Value)
			continue
		}
		toks = root.Content[i+1]
	}
	if toks != nil && toks.Kind != yaml.MappingNode && !(toks.Kind == yaml.ScalarNode && toks.Tag == "!!null") {
		at(toks, "tokens: want a mapping of name → {role, sha256}")
		toks = nil
	}
	seen := map[string]bool{}
	for i := 0; toks != nil && i+1 < len(toks.Content); i += 2 {
		k, v := toks.Content[i], toks.Content[i+1]
		name := k.Value
		switch {
		case CheckName(name) != nil:
			at(k, "%v", CheckName(name))
			continue
		case seen[name]:
			at(k, "token %q is named twice", name)
			continue
		}
		seen[name] = true
		if v.Kind != yaml.MappingNode {
			at(v, "token %q: want {role: read|operate|admin, sha256: HEX}", name)
			continue
		}
		var role Role
		var sum []byte
		var roleSet, sumSet, bad bool
		for j := 0; j+1 < len(v.Content); j += 2 {
			fk, fv := v.Content[j], v.Content[j+1]
			switch fk.Value {
			case "role":
				r, err := ParseRole(fv.Value)
				if err != nil {
					at(fv, "token %q: %v", name, err)
					bad = true
				}
				role, roleSet = r, true
			case "sha256":
				s, err := hex.DecodeString(strings.TrimPrefix(fv.Value, "sha256:"))
				if err != nil || len(s) != sha256.Size {
					at(fv, "token %q: sha256 must be 64 hex digits (beatd token hash prints it); a plain token is never stored here", name)
					bad = true
				}
				sum, sumSet = s, true
			default:
				at(fk, "token %q: unknown key %q (want role, sha256)", name, fk.Value)
				bad = true
			}
		}
		if bad {
			continue
		}
		if !roleSet || !sumSet {
			if !roleSet {
				at(v, "token %q: role is missing", name)
			}
			if !sumSet {
				at(v, "token %q: sha256 is missing", name)
			}
			continue
		}
		var h [32]byte
		copy(h[:], sum)
		if prev, dup := out[h]; dup {
			at(v, "token %q has the same hash as %q: one token must have one name", name, prev.Name)
			continue
		}
		out[h] = Identity{Name: name, Role: role}
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "\n"))
	}
	return out, nil
}
