package termsafe

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Line makes user text (entry and task names, notes, actors, arguments,
// the server's and etcd's error text) safe to print to a terminal, in a
// table cell or on a line of its own: every rune that is not printable
// (C0 and C1 controls, DEL, tabs and newlines, Unicode format characters
// such as bidi overrides) and every byte of invalid UTF-8 is written as
// strconv.Quote writes it (\x1b, \r, \t, \u009b, \u202e, \xff). Printable
// Unicode, spaces and backslashes pass as they are. It is the one
// escaper of the CLI's text output; JSON and YAML output need none.
func Line(s string) string {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || !strconv.IsPrint(r) {
			break
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case strconv.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\u009b', '\t'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// Text is Line for a message of several lines (an error that lists
// its problems one a line): each line is escaped, the line breaks stay.
func Text(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Line(l)
	}
	return strings.Join(lines, "\n")
}
