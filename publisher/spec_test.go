package publisher

import "github.com/beatd/beatd/config"

// specOf is scheduler.SpecOf, which this package cannot import, so tests
// can write their entries as YAML.
func specOf(e *config.Entry) *Spec {
	return &Spec{Name: e.Name, Task: e.Task, Args: e.Args, Kwargs: e.Kwargs, Options: *e.Options}
}
