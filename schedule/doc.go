// Package schedule computes when beatd entries fire and loads schedules.yaml.
//
// It is pure: no I/O beyond reading the config bytes it is handed, and every
// function that needs the current time takes it as an argument. Slots are
// computed on the wall clock of an entry's zone with one DST policy for every
// calendar spec (see Resolve), so every replica derives the same slots
// without coordinating.
package schedule
