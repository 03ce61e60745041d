package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/beatd/beatd/testkit/harness"
)

// celeryApp is the generated Celery app: n interval entries, each with its
// own task name so the consumer can tell them apart (celery beat sends by
// name; no worker runs the tasks).
const celeryApp = `from celery import Celery

app = Celery("soakapp", broker=%q)
app.conf.beat_schedule = {
    "e%%05d" %% i: {"task": "soak.e%%05d" %% i, "schedule": %g}
    for i in range(%d)
}
`

// StartCeleryBeat writes the app into dir and runs celery beat from
// python (Debian's /usr/bin/python3 has python3-celery), with its schedule
// file in dir.
func StartCeleryBeat(ctx context.Context, ps *Procs, python, dir, broker string, n int, interval time.Duration) (*Proc, error) {
	if err := os.WriteFile(filepath.Join(dir, "soakapp.py"), []byte(fmt.Sprintf(celeryApp, broker, interval.Seconds(), n)), 0o644); err != nil {
		return nil, fmt.Errorf("soak: write celery app: %w", err)
	}
	return ps.Start(harness.Spec{Name: "celery-beat", Bin: python, LogPath: filepath.Join(dir, "celery-beat.log"), Dir: dir,
		Env: []string{"PYTHONPATH=" + dir, "PYTHONDONTWRITEBYTECODE=1"},
		Args: []string{"-m", "celery", "-A", "soakapp", "beat", "--loglevel=WARNING",
			"--schedule=" + filepath.Join(dir, "celerybeat-schedule"), "--pidfile="}})
}
