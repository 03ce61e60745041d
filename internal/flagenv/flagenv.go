// Package flagenv is the command line's one convention for flags: GNU-style
// flag sets that report errors instead of exiting, and a BEATD_* variable
// for every flag (--lease-ttl reads BEATD_LEASE_TTL), for Kubernetes
// manifests. The CLI and the daemon's run flags both use it.
package flagenv

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
)

// New returns a GNU-style FlagSet that reports errors instead of
// exiting. Commands add it to their cobra command, which parses it.
func New(name string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("beatd "+name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	return fs
}

// EnvName is the variable that can set a flag: --lease-ttl reads
// BEATD_LEASE_TTL, for Kubernetes manifests.
func EnvName(flagName string) string {
	return "BEATD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args, then fills every flag not given on the command
// line from its BEATD_* environment variable. Flags win over env.
func Parse(fs *pflag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	return ApplyEnv(fs)
}

// ApplyEnv sets every flag not given on the command line from its BEATD_*
// variable, if set.
func ApplyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil || noEnv[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, e)
				return
			}
			_ = fs.SetAnnotation(f.Name, sourceKey, []string{"env"})
		}
	})
	return err
}

const sourceKey = "flagenv.source"

// FromArgs reports whether the flag was given on the command line (not
// by its variable, and not left at its default). A secret given there is
// in the process's argv, which every local user can read (ps,
// /proc/PID/cmdline) and Kubernetes shows in the pod spec.
func FromArgs(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed && len(f.Annotations[sourceKey]) == 0
}

// noEnv are flags no variable sets: cobra's own.
var noEnv = map[string]bool{"help": true, "version": true}

// secretEnv are variables that hold secrets, read only from the
// environment (or a file flag), never from a flag value.
var secretEnv = map[string]string{
	"etcd-password-file":   "BEATD_ETCD_PASSWORD",
	"broker-password-file": "BEATD_BROKER_PASSWORD",
	"admin-token-file":     "BEATD_ADMIN_TOKEN",
}

// Help lists the variables that set fs's flags, for a command's help.
func Help(fs *pflag.FlagSet) string {
	type row struct{ env, what string }
	var rows []row
	fs.VisitAll(func(f *pflag.Flag) {
		if noEnv[f.Name] || f.Hidden {
			return
		}
		rows = append(rows, row{EnvName(f.Name), "--" + f.Name})
		if s, ok := secretEnv[f.Name]; ok {
			rows = append(rows, row{s, "the secret itself, when --" + f.Name + " is not given"})
		}
	})
	if len(rows) == 0 {
		return ""
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].env < rows[j].env })
	w := 0
	for _, r := range rows {
		w = max(w, len(r.env))
	}
	var b strings.Builder
	b.WriteString("\nEnvironment (a flag on the command line wins):\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-*s  %s\n", w, r.env, r.what)
	}
	return b.String()
}
