package outcome

import (
	"strings"
	"unicode/utf8"
)

// Exception returns the type and message of a task's exception from a
// task-failed event's exception (a repr, like ZeroDivisionError('division
// by zero')) and traceback fields. Celery 5.2 on Python 3.11 sends
// exception "ExceptionWithTraceback()" from the threads and solo pools:
// the real type is then only on the traceback's last line, which is
// preferred whenever it names one.
func Exception(repr, traceback string) (typ, msg string) {
	if typ, msg, ok := tracebackLast(traceback); ok {
		return typ, capped(msg)
	}
	repr = strings.TrimSpace(repr)
	if repr == "" {
		return "", ""
	}
	open := strings.IndexByte(repr, '(')
	if open <= 0 || !strings.HasSuffix(repr, ")") || !isDotted(repr[:open]) {
		return "", capped(repr)
	}
	return repr[:open], capped(unquote(repr[open+1 : len(repr)-1]))
}

// tracebackLast reads a Python traceback's last line, "Type: message" or
// a bare "Type".
func tracebackLast(tb string) (typ, msg string, ok bool) {
	tb = strings.TrimRight(tb, "\n ")
	if tb == "" {
		return "", "", false
	}
	last := tb[strings.LastIndexByte(tb, '\n')+1:]
	if strings.HasPrefix(last, " ") {
		return "", "", false // the last line is code, not the exception
	}
	name, rest, hasMsg := strings.Cut(last, ": ")
	if !isDotted(name) {
		return "", "", false
	}
	if !hasMsg {
		return name, "", true
	}
	return name, rest, true
}

func isDotted(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '.' || r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// unquote strips the quotes of a repr'd single string argument; anything
// else (several arguments) is kept as written.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0] && !strings.ContainsRune(s[1:len(s)-1], rune(s[0])) {
		return s[1 : len(s)-1]
	}
	return s
}

// capped cuts s to MaxMessage bytes on a rune boundary.
func capped(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	cut := MaxMessage - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
