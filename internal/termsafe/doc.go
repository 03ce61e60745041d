// Package termsafe escapes user text (names, notes, error text) for
// printing to a terminal: the one escaper of beatd's text output.
package termsafe
