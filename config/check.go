package config

import (
	"fmt"
	"os"

	"github.com/beatd/beatd/celery"
)

// CheckError is a config file that cannot run: its text is one problem
// a line, FILE:LINE:COL: message where the file says where.
type CheckError struct{ Err error }

func (e *CheckError) Error() string { return e.Err.Error() }
func (e *CheckError) Unwrap() error { return e.Err }

// Check is every check a config file gets before anything contacts a
// server: `beatd validate` and `beatd run` (at start and on reload) call
// it. Its error is a *CheckError.
func Check(path string, data []byte, opt Options) (*Config, error) {
	return CheckPart(path, data, opt, nil)
}

// CheckPart is Check building only the entries whose names keep holds
// (nil: all): a sharded replica's share of a file Check accepted whole.
// The YAML is still read whole, but the other entries are neither
// parsed nor checked, so a part costs a fraction of the file's entries.
func CheckPart(path string, data []byte, opt Options, keep func(name string) bool) (*Config, error) {
	cfg, err := parseKeeping(path, data, opt, keep)
	if err != nil {
		return nil, &CheckError{err}
	}
	for _, e := range cfg.Entries {
		if err := CheckEntry(e); err != nil {
			return nil, &CheckError{fmt.Errorf("%s: %w", path, err)}
		}
	}
	return cfg, nil
}

// CheckFile is Check of the file at path.
func CheckFile(path string, opt Options) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &CheckError{fmt.Errorf("config: read: %w", err)}
	}
	return Check(path, data, opt)
}

// CheckEntry reports whether e's messages can be built, as the scheduler
// will build them (celery.Validate of its Spec).
func CheckEntry(e *Entry) error {
	if e.Options == nil {
		return nil // no options: nothing of the Spec can fail
	}
	return celery.ValidateOptions(e.Name, e.Options)
}
