// Package config reads schedules.yaml, and entries from other sources in
// the same schema, into validated entries: what each task is, when it
// fires (a schedule.Schedule), how it is sent and how a new leader
// catches up.
//
// It reads only the bytes it is handed (or the one file LoadFile names),
// and reports every problem at once with the file, line and column, or a
// JSON pointer for a single entry given as a document (ParseEntry).
package config
