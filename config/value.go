package config

import (
	"errors"

	"gopkg.in/yaml.v3"
)

// Value is the Celery value schedules.yaml gives the YAML node n when it
// stands in task arguments (args, kwargs, a header): nil, bool, int64,
// *big.Int (integers beyond 64 bits, exact), float64 (1.0 stays a float),
// string, []any or *celery.Map. It is the one reading of a scalar: the
// file, the entries API (JSON read as YAML) and `beatd entries apply`
// (which writes YAML as the JSON that reads back to the same value) all
// go through it.
func Value(n *yaml.Node) (any, error) {
	d := &decoder{file: "value"}
	v, ok := d.value(n)
	if !ok {
		if len(d.errs) > 0 {
			return nil, errors.New(d.errs[0].Msg)
		}
		return nil, errors.New("config: unsupported value")
	}
	return v, nil
}
