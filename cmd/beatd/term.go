package main

import "github.com/beatd/beatd/internal/termsafe"

// term makes user text safe to print to a terminal: termsafe.Line, the
// one escaper of the CLI's and the daemon's text output.
func term(s string) string { return termsafe.Line(s) }

// termText is term for a message of several lines: termsafe.Text.
func termText(s string) string { return termsafe.Text(s) }

// termErr is termText of an error's text.
func termErr(err error) string { return termText(err.Error()) }
