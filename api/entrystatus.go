package api

import (
	"cmp"
	"fmt"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/sources"
)

// EntryStatusOf is the part of an entry's status its definition gives:
// name, source, task, schedule, enabled. /status, the CLI and the web
// console all take these fields from it, so they say the same thing.
// An entry of the schedule file may have no source set: it is "file".
func EntryStatusOf(e *config.Entry) EntryStatus {
	st := EntryStatus{Name: e.Name, Source: cmp.Or(e.Source, sources.File), Task: e.Task,
		Schedule: fmt.Sprint(e.Schedule), Enabled: e.Enabled, Templated: e.Templated()}
	if e.Canvas() != nil {
		st.Workflow = e.Workflow()
	}
	return st
}
