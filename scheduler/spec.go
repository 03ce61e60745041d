package scheduler

import (
	"github.com/beatd/beatd/config"
)

// ValidateEntry reports whether e's messages can be built, as the
// scheduler will build them.
func ValidateEntry(e *config.Entry) error { return config.CheckEntry(e) }
