package celery

import "time"

// Spec is what a task's messages say: the task, its arguments and Celery's
// send options. It is the publisher's own description, so how entries are
// written (schedules.yaml, the API, django-celery-beat) stays out of this
// package; the scheduler builds one per entry.
type Spec struct {
	Name    string // the entry: it namespaces task ids
	Task    string
	Args    []any
	Kwargs  *Map
	Options SendOptions
	// Zone and Prev serve a templated entry (Options.Templated): the zone
	// its times render in, and its schedule's slot before a given one
	// (zero: none).
	Zone *time.Location
	Prev func(slot time.Time) time.Time
}
