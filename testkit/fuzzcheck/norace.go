//go:build !race

package fuzzcheck

// slowdown scales TimeLimit under the race detector.
const slowdown = 1
