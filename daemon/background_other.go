//go:build !linux

package daemon

// inBackground runs fn. Only Linux lowers one thread's priority
// (background_linux.go).
func inBackground(fn func()) { fn() }
