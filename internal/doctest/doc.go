// Package doctest finds the shell blocks of README.md and docs/*.md, so
// that its tests run each one against real servers or hold it to a
// written reason why it is only illustrative.
package doctest
