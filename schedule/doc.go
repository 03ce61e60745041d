// Package schedule computes when beatd entries fire: crontab (Celery's
// semantics), cron, every, at and solar schedules, missed slots and their
// descriptions.
//
// It is pure time math: no I/O, and every function that needs the current
// time takes it as an argument. Slots are computed on the wall clock of an
// entry's zone with one DST policy for every calendar spec, so every
// replica derives the same slots without coordinating. An H (hashed
// spread) is resolved from the entry's name when a spec is parsed, so it
// is the same on every replica too. Reading the YAML
// into entries is package config's job.
package schedule
