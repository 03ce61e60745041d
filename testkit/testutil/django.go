package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Django is a throwaway Django project whose only app is the real
// django-celery-beat (Debian's python3-django-celery-beat), used to create
// and edit its rows through the Django ORM, as its users do.
type Django struct {
	Dir    string
	python string
}

// Python returns Debian's python3, where Django and django-celery-beat
// are installed (a python3 earlier in PATH may lack them).
func Python() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

// MustMigrateDjango writes the project with database db (the Python
// literal of DATABASES['default']) and runs manage.py migrate.
func MustMigrateDjango(tb testing.TB, db string) *Django {
	tb.Helper()
	d, err := newDjango(tb.TempDir(), db)
	if err == nil {
		err = d.migrate()
	}
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// djangoTemplates are migrated databases, one per backend (and Postgres
// server), made once per test process and copied for each test that asks:
// django-celery-beat's migrations took 10-17 s a run at load 16, waiting
// on the disk (a second of CPU).
var djangoTemplates struct {
	mu     sync.Mutex
	sqlite []byte               // a migrated SQLite file's bytes
	pg     map[*Postgres]string // a server's migrated template database
}

// MustDjangoSQLite returns a project on a fresh SQLite file, migrated,
// and the file's path.
func MustDjangoSQLite(tb testing.TB) (*Django, string) {
	tb.Helper()
	djangoTemplates.mu.Lock()
	if djangoTemplates.sqlite == nil {
		b, err := migratedSQLite()
		if err != nil {
			djangoTemplates.mu.Unlock()
			tb.Fatal(err)
		}
		djangoTemplates.sqlite = b
	}
	b := djangoTemplates.sqlite
	djangoTemplates.mu.Unlock()
	dir := tb.TempDir()
	path := filepath.Join(dir, "dcb.sqlite3")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	d, err := newDjango(dir, sqliteDB(path))
	if err != nil {
		tb.Fatal(err)
	}
	return d, path
}

// migratedSQLite migrates a SQLite file in a directory of its own and
// returns its bytes.
func migratedSQLite() ([]byte, error) {
	dir, err := os.MkdirTemp("", "beatd-dcb-template")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "dcb.sqlite3")
	d, err := newDjango(dir, sqliteDB(path))
	if err == nil {
		err = d.migrate()
	}
	if err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

func sqliteDB(path string) string {
	return fmt.Sprintf(`{"ENGINE": "django.db.backends.sqlite3", "NAME": %q}`, path)
}

// PostgresDB is the Python literal of DATABASES['default'] for database
// db of p.
func PostgresDB(p *Postgres, db string) string {
	return fmt.Sprintf(`{"ENGINE": "django.db.backends.postgresql", "NAME": %q, "USER": "postgres", "HOST": "127.0.0.1", "PORT": "%d"}`, db, p.Port)
}

// MustDjangoPostgres returns a project on a new database of p named after
// prefix (as MustCreateDB names it), migrated, and the database's name.
// The first call for p migrates a template database on it; each database
// after is a copy (CREATE DATABASE ... TEMPLATE).
func MustDjangoPostgres(tb testing.TB, p *Postgres, prefix string) (*Django, string) {
	tb.Helper()
	djangoTemplates.mu.Lock()
	tmpl, ok := djangoTemplates.pg[p]
	if !ok {
		tmpl = MustCreateDB(tb, p, "dcb_template")
		d, err := newDjango(tb.TempDir(), PostgresDB(p, tmpl))
		if err == nil {
			err = d.migrate()
		}
		if err != nil {
			djangoTemplates.mu.Unlock()
			tb.Fatal(err)
		}
		if djangoTemplates.pg == nil {
			djangoTemplates.pg = map[*Postgres]string{}
		}
		djangoTemplates.pg[p] = tmpl
	}
	djangoTemplates.mu.Unlock()
	name := mustCreateDBFrom(tb, p, prefix, tmpl)
	d, err := newDjango(tb.TempDir(), PostgresDB(p, name))
	if err != nil {
		tb.Fatal(err)
	}
	return d, name
}

// newDjango writes the project into dir with database db.
func newDjango(dir, db string) (*Django, error) {
	d := &Django{Dir: dir, python: Python()}
	files := map[string]string{
		"dcbsettings.py": `SECRET_KEY = "test"
INSTALLED_APPS = ["django_celery_beat"]
USE_TZ = True
TIME_ZONE = "UTC"
DATABASES = {"default": ` + db + `}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
`,
		"manage.py": `import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dcbsettings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
`,
		"orm.py": `import os, sys, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dcbsettings")
django.setup()
from django_celery_beat.models import *
exec(sys.stdin.read())
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(d.Dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// migrate runs manage.py migrate.
func (d *Django) migrate() error {
	cmd := exec.Command(d.python, "manage.py", "migrate", "--noinput", "-v", "0")
	cmd.Dir = d.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("manage.py migrate: %w\n%s", err, out)
	}
	return nil
}

// ORM runs Python code with the models of django_celery_beat imported,
// and returns what it prints.
func (d *Django) ORM(tb testing.TB, code string) string {
	tb.Helper()
	cmd := exec.Command(d.python, "orm.py")
	cmd.Dir = d.Dir
	cmd.Stdin = bytes.NewReader([]byte(code))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		tb.Fatalf("django ORM: %v\n%s\ncode:\n%s", err, errb.String(), code)
	}
	return out.String()
}
