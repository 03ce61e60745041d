package config

import (
	"fmt"
	"math/big"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CheckEntryName enforces the entry name rule: at most MaxNameLength
// printable characters (letters, marks, numbers, punctuation, symbols and
// the ASCII space), no '/', not "." or "..", and no leading or trailing
// space. Names are etcd keys, task ids' seed, metric labels and table
// cells: a tab, a newline or a path element would break one of them.
func CheckEntryName(name string) error {
	switch {
	case name == "" || strings.TrimSpace(name) == "":
		return fmt.Errorf("entry name must be a non-empty string")
	case len(name) > MaxNameLength && utf8.RuneCountInString(name) > MaxNameLength:
		return fmt.Errorf("entry name %q is %d characters long; the limit is %d", shortName(name), utf8.RuneCountInString(name), MaxNameLength)
	case !utf8.ValidString(name):
		return fmt.Errorf("entry name %q is not valid UTF-8", name)
	case name == "." || name == "..":
		return fmt.Errorf("entry name %q is not allowed: '.' and '..' are path elements", name)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("entry name %q must not start or end with a space", name)
	case strings.ContainsRune(name, '/'):
		return fmt.Errorf("entry name %q must not contain '/'", name)
	}
	for i, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("entry name %q: character %U at byte %d is not printable (tabs, newlines and control characters are not allowed)", name, r, i)
		}
	}
	return nil
}

// bigInt parses a YAML integer literal too large for int64 (decimal, or
// 0x, 0o, 0b; underscores allowed as YAML does) into an exact *big.Int.
func bigInt(lit string) (*big.Int, bool) {
	plain := strings.ReplaceAll(lit, "_", "")
	if plain == "" || strings.ContainsAny(plain, ".eE") && !strings.HasPrefix(strings.TrimLeft(plain, "+-"), "0x") {
		return nil, false
	}
	b, ok := new(big.Int).SetString(strings.TrimPrefix(plain, "+"), 0)
	if !ok || b.IsInt64() {
		return nil, false
	}
	return b, true
}
