package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Load reads a source, telling its kind from the argument: a redis://,
// rediss:// or unix:// URL is RedBeat; a JSON object written by
// contrib/celery_dump.py is a Celery app; a JSON array of
// django_celery_beat objects is a dumpdata. "-" reads stdin.
func Load(ctx context.Context, arg, redbeatPrefix string) (*Source, error) {
	for _, scheme := range []string{"redis://", "rediss://", "unix://"} {
		if strings.HasPrefix(arg, scheme) {
			return readRedBeat(ctx, arg, redbeatPrefix)
		}
	}
	var data []byte
	var err error
	if arg == "-" {
		data, err = readAll(os.Stdin)
		arg = "stdin"
	} else {
		data, err = os.ReadFile(arg)
	}
	if err != nil {
		return nil, fmt.Errorf("import: read %w", err)
	}
	return Parse(arg, data)
}

func readAll(f *os.File) ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(f)
	return b.Bytes(), err
}

// Parse tells a celery_dump.py dump from a dumpdata by its shape.
func Parse(origin string, data []byte) (*Source, error) {
	trimmed := bytes.TrimSpace(data)
	switch {
	case bytes.HasPrefix(trimmed, []byte("{")):
		var probe struct {
			Source string `json:"source"`
		}
		if err := json.Unmarshal(trimmed, &probe); err != nil {
			return nil, fmt.Errorf("%s: %w", origin, err)
		}
		if probe.Source != "celery" {
			return nil, fmt.Errorf("%s: a JSON object, but not one written by contrib/celery_dump.py", origin)
		}
		return parseCeleryDump(origin, trimmed)
	case bytes.HasPrefix(trimmed, []byte("[")):
		var rows []djangoRow
		if err := json.Unmarshal(trimmed, &rows); err != nil {
			return nil, fmt.Errorf("%s: not a dumpdata file: %w", origin, err)
		}
		n := 0
		for _, r := range rows {
			if strings.HasPrefix(r.Model, "django_celery_beat.") {
				n++
			}
		}
		if n == 0 && len(rows) > 0 {
			return nil, fmt.Errorf("%s: a dumpdata file without django_celery_beat objects", origin)
		}
		return parseDjango(origin, rows)
	}
	return nil, fmt.Errorf("%s: not a celery_dump.py dump, a dumpdata file or a redis:// URL", origin)
}
