package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/beatd/beatd/internal/embedetcd"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/migrate"
	"github.com/beatd/beatd/store"
)

// runImport converts a celery beat schedule (a celery_dump.py dump, a
// django-celery-beat dumpdata, or RedBeat in Redis) to schedules.yaml on
// stdout; warnings go to stderr. --state also writes each entry's last send
// into etcd; --check compares fire times with Celery's instead.
func runImport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flagenv.New("import", stderr)
	state := fs.Bool("state", false, "also write each entry's last send (celery beat's state) into etcd, for the cutover")
	force := fs.Bool("force", false, "with --state: overwrite the state of entries beatd has already fired")
	check := fs.Bool("check", false, "compare the next fire times of every entry with Celery's (through the helper); exit 1 on a difference")
	count := fs.Int("check-count", 50, "with --check: fire times compared per entry")
	python := fs.String("python", defaultPython(), "Python with Celery (and ephem for solar entries), for --check")
	helper := fs.String("helper", "", "path of contrib/celery_dump.py (default: found next to the binary or in ./contrib)")
	redbeatPrefix := fs.String("redbeat-prefix", "redbeat:", "RedBeat's key prefix (REDBEAT_KEY_PREFIX)")
	from := fs.String("from", "", "the time the import takes as now (RFC 3339; default: now): where --check starts, and which one-off and start_time entries count as past")
	dataDir := fs.String("data-dir", "", "with --state and no --etcd-endpoints: the data dir of beatd's embedded etcd (as given to beatd run), started here while the state is written")
	var ef etcdflags.Flags
	ef.Register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: beatd import [--state [--force] --etcd-endpoints URLS --prefix P] [--check] SRC > schedules.yaml")
		fmt.Fprintln(stderr, "SRC: a dump from contrib/celery_dump.py, a `manage.py dumpdata django_celery_beat` file, or a RedBeat redis:// URL")
		fs.PrintDefaults()
	}
	if err := flagenv.Parse(fs, args); err != nil {
		return exitCode(err)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	now := time.Now()
	if *from != "" {
		t, err := time.Parse(time.RFC3339Nano, *from)
		if err != nil {
			fmt.Fprintf(stderr, "beatd import: --from %q: want an RFC 3339 time such as 2026-12-01T06:00:00Z\n", *from)
			return 2
		}
		now = t
	}
	src, err := migrate.Load(ctx, fs.Arg(0), *redbeatPrefix)
	if err != nil {
		fmt.Fprintln(stderr, "beatd import:", termErr(err))
		return 1
	}
	res, err := migrate.Convert(src, migrate.Options{Now: now})
	if err != nil {
		fmt.Fprintln(stderr, "beatd import:", termErr(err))
		return 1
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(stderr, "warning:", termText(w))
	}
	if *check {
		return importCheck(ctx, res, *python, *helper, *count, now, stdout, stderr)
	}
	if _, err := io.WriteString(stdout, res.YAML); err != nil {
		fmt.Fprintln(stderr, "beatd import:", termErr(err))
		return 1
	}
	fmt.Fprintf(stderr, "beatd import: %d entries converted, %d not (see the warnings)\n", len(res.Config.Entries), len(res.Skipped))
	if !*state {
		return 0
	}
	return importState(ctx, res, &ef, *dataDir, *force, stderr)
}

// importState writes the last slots into etcd.
func importState(ctx context.Context, res *migrate.Result, ef *etcdflags.Flags, dataDir string, force bool, stderr io.Writer) int {
	if len(ef.EndpointURLs()) == 0 && dataDir != "" {
		// beatd run's embedded etcd keeps its data here: start it on free
		// ports just for the import (beatd run must not be running).
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			fmt.Fprintln(stderr, "beatd import: data dir:", termErr(err))
			return 1
		}
		srv, err := embedetcd.Start(embedetcd.Config{Dir: filepath.Join(dataDir, "etcd"), Name: "beatd"})
		if err != nil {
			fmt.Fprintln(stderr, "beatd import: embedded etcd (is beatd run still running on this data dir?):", termErr(err))
			return 1
		}
		defer srv.Close()
		ef.Endpoints = strings.Join(srv.Endpoints, ",")
	}
	cli, err := ef.Client()
	if err != nil {
		fmt.Fprintln(stderr, "beatd import:", termErr(err))
		return 1
	}
	defer cli.Close()
	var in []store.ImportedState
	for _, st := range res.States {
		in = append(in, store.ImportedState{Name: st.Name, LastSlot: st.LastSlot})
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	refused, err := store.New(cli, ef.KeyPrefix()).Import(ctx, in, force)
	if err != nil {
		fmt.Fprintln(stderr, "beatd import:", termErr(err))
		return 1
	}
	skip := map[string]bool{}
	for _, n := range refused {
		skip[n] = true
		fmt.Fprintf(stderr, "warning: entry %q: state not written: beatd has already fired it (use --force to overwrite)\n", n)
	}
	for _, st := range res.States {
		if !skip[st.Name] {
			fmt.Fprintf(stderr, "state: entry %q: last slot %s (celery beat sent it at %s)\n", st.Name,
				st.LastSlot.UTC().Format(time.RFC3339Nano), st.LastRunAt.UTC().Format(time.RFC3339Nano))
		}
	}
	fmt.Fprintf(stderr, "beatd import: state of %d entries written to %s\n", len(res.States)-len(refused), ef.KeyPrefix())
	if len(refused) > 0 {
		return 1
	}
	return 0
}

// importCheck compares fire times with Celery's, through the helper.
func importCheck(ctx context.Context, res *migrate.Result, python, helper string, n int, now time.Time, stdout, stderr io.Writer) int {
	if helper == "" {
		helper = findHelper()
	}
	if helper == "" {
		fmt.Fprintln(stderr, "beatd import --check: contrib/celery_dump.py not found; give --helper")
		return 2
	}
	diffs, err := migrate.Compare(ctx, migrate.Helper{Python: python, Script: helper}, res.Checks, n, now)
	if err != nil {
		fmt.Fprintln(stderr, "beatd import --check:", termErr(err))
		return 1
	}
	failed := 0
	for _, d := range diffs {
		fmt.Fprintln(stdout, termText(fmt.Sprint(d)))
		if d.Documented == "" {
			failed++
		}
	}
	fmt.Fprintf(stdout, "checked %d entries, %d fire times each: %d differences (%d documented deviations)\n",
		len(res.Checks), n, failed, len(diffs)-failed)
	if failed > 0 || len(res.Skipped) > 0 {
		return 1
	}
	return 0
}

func defaultPython() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3" // Debian's, which has python3-celery
	}
	return "python3"
}

// findHelper looks for contrib/celery_dump.py next to the binary (and one
// level up, for bin/beatd in a checkout), then under the working directory.
func findHelper() string {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe), filepath.Dir(filepath.Dir(exe)))
	}
	dirs = append(dirs, ".")
	for _, d := range dirs {
		p := filepath.Join(d, "contrib", "celery_dump.py")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}
