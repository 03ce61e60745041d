//go:build !race

package console

const raceEnabled = false
