package scheduler

import (
	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/publisher"
)

// SpecOf is the publisher's description of e's messages.
func SpecOf(e *config.Entry) *publisher.Spec {
	s := &publisher.Spec{Name: e.Name, Task: e.Task, Args: e.Args, Kwargs: e.Kwargs}
	if e.Options != nil {
		s.Options = *e.Options
	}
	return s
}

// ValidateEntry reports whether e's messages can be built, as the
// scheduler will build them.
func ValidateEntry(e *config.Entry) error { return publisher.Validate(SpecOf(e)) }
