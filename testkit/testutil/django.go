package testutil

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
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
	d := &Django{Dir: tb.TempDir(), python: Python()}
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
			tb.Fatal(err)
		}
	}
	cmd := exec.Command(d.python, "manage.py", "migrate", "--noinput", "-v", "0")
	cmd.Dir = d.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("manage.py migrate: %v\n%s", err, out)
	}
	return d
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
