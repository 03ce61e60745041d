package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/beatd/beatd/daemon"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/internal/version"
	"github.com/beatd/beatd/store"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit codes: 0 success, 1 the command failed, 2 it was used wrongly.
const (
	exitFail  = 1
	exitUsage = 2
)

// exitError ends a command with a code; its message, if any, was already
// printed.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// codeErr turns a command's exit code into cobra's error.
func codeErr(code int) error {
	if code == 0 {
		return nil
	}
	return exitError(code)
}

// usageError is a wrong invocation: a bad flag, a wrong argument count,
// an unknown command. It prints short, with a pointer to --help.
type usageError struct {
	cmd *cobra.Command
	err error
}

func (e usageError) Error() string { return e.err.Error() }

// run executes the beatd command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(ctx, stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	var code exitError
	if errors.As(err, &code) {
		return int(code)
	}
	var ue usageError
	if errors.As(err, &ue) {
		cmd = ue.cmd
	}
	fmt.Fprintf(stderr, "beatd: %s\nRun '%s --help' for usage.\n", termErr(err), cmd.CommandPath())
	return exitUsage
}

// newRoot builds the command tree.
func newRoot(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "beatd",
		Short: "A highly available replacement for Celery's celery beat",
		Long: `beatd publishes Celery periodic tasks from a schedules.yaml. Replicas elect a
leader through etcd; only the leader publishes, each (entry, slot) exactly once.

Where commands go: every command finds the cluster through etcd
(--etcd-endpoints, --prefix). status, trigger, pause, resume and members work
on the cluster's state in etcd, so they work with no replica running; next
reads it too when given --etcd-endpoints. entries and backfill go through the
HTTP API of the leader, at the address it registered in etcd, because a
running replica validates and applies them; status asks the leader for the
last results and recent runs. --server sends them to another replica.`,
		Version:       version.String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          usageArgs(cobra.NoArgs),
		// Without a command, help, as kubectl does.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetContext(ctx)
	root.SetVersionTemplate("beatd {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{c, err} })
	root.SetUsageTemplate(root.UsageTemplate() + "{{envHelp .}}")
	root.SetHelpCommand(helpCommand(root))
	root.CompletionOptions.HiddenDefaultCmd = false
	root.AddCommand(
		runCommand(ctx, stdout, stderr),
		validateCommand(stdout, stderr),
		nextCommand(stdout, stderr),
		statusCommand(ctx, stdout, stderr),
		adminCommand(ctx, store.OpTrigger, "ask the leader to publish an entry now", stdout, stderr),
		adminCommand(ctx, store.OpPause, "pause an entry (survives failover)", stdout, stderr),
		adminCommand(ctx, store.OpResume, "resume a paused entry", stdout, stderr),
		backfillCommand(ctx, stdout, stderr),
		auditCommand(ctx, stdout, stderr),
		shardsCommand(ctx, stdout, stderr),
		tokenCommand(os.Stdin, stdout, stderr),
		certsCommand(stdout, stderr),
		&cobra.Command{
			Use:   "import [flags] SRC",
			Short: "convert a celery beat, django-celery-beat or RedBeat schedule (and its state)",
			// import parses its own flags (beatd import --help lists them).
			DisableFlagParsing: true,
			RunE:               func(_ *cobra.Command, args []string) error { return codeErr(runImport(ctx, args, stdout, stderr)) },
		},
		&cobra.Command{
			Use:   "entries list|get NAME|apply -f FILE|delete NAME",
			Short: "list, get, apply and delete runtime entries through the HTTP entries API",
			// entries parses its own flags (beatd entries --help lists them).
			DisableFlagParsing: true,
			RunE:               func(_ *cobra.Command, args []string) error { return codeErr(runEntries(ctx, args, stdout, stderr)) },
		},
		&cobra.Command{
			Use:   "members list|add NAME=PEER_URL|remove NAME",
			Short: "list, add or remove etcd members (embedded cluster mode)",
			// members parses its own flags (beatd members --help lists them).
			DisableFlagParsing: true,
			RunE:               func(_ *cobra.Command, args []string) error { return codeErr(runMembers(ctx, args, stdout, stderr)) },
		},
		&cobra.Command{
			Use: "version", Short: "print the version", Args: usageArgs(cobra.NoArgs),
			RunE: func(*cobra.Command, []string) error { return codeErr(runVersion(ctx, nil, stdout, stderr)) },
		},
	)
	return root
}

func init() {
	cobra.AddTemplateFunc("envHelp", func(c *cobra.Command) string {
		if c.Name() == "help" || c.Name() == "completion" || (c.Parent() != nil && c.Parent().Name() == "completion") {
			return ""
		}
		return flagenv.Help(c.LocalFlags())
	})
}

// usageArgs wraps an argument check so a wrong count is a usage error.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if err := check(c, args); err != nil {
			return usageError{c, err}
		}
		return nil
	}
}

// helpCommand is `beatd help [COMMAND...]`. Unlike cobra's default it
// fails on an unknown topic.
func helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "help about any command",
		ValidArgsFunction: func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			var out []cobra.Completion
			for _, sub := range root.Commands() {
				if sub.IsAvailableCommand() {
					out = append(out, sub.Name())
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || target == nil || len(rest) > 0 {
				return usageError{c, fmt.Errorf("unknown help topic %q", strings.Join(args, " "))}
			}
			return target.Help()
		},
	}
}

// commandFlags adds fs to cmd and, before the command runs, fills the
// flags not given from their BEATD_* variables.
func commandFlags(cmd *cobra.Command, fs *pflag.FlagSet) {
	cmd.Flags().AddFlagSet(fs)
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if err := flagenv.ApplyEnv(c.Flags()); err != nil {
			return usageError{c, err}
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

// defaultTimeout bounds every etcd or Redis call of a CLI command.
const defaultTimeout = 10 * time.Second

// runCommand is `beatd run`.
func runCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	m := daemon.NewMain(stdout, stderr)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "run the scheduler (leader election, publishing, HTTP)",
		Long: `Run a beatd replica: it campaigns for leadership in etcd, and while it leads it
publishes the entries of --config to the Celery broker. Every replica serves
health, metrics and status over HTTP. SIGHUP or a change of the file reloads
the config; SIGINT/SIGTERM hands leadership over and stops.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(c *cobra.Command, _ []string) error {
			m.NoteArgvSecrets(c.Flags())
			if err := m.CheckFlags(); err != nil {
				return usageError{c, err}
			}
			return codeErr(m.Serve(ctx))
		},
	}
	commandFlags(cmd, m.Flags())
	return cmd
}

// subcommandHelp handles a command that takes a subcommand before its
// flags: none prints usage and exits 2, help prints it and exits 0.
func subcommandHelp(args []string, usage func() int) (code int, done bool) {
	if len(args) == 0 {
		return usage(), true
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		return 0, true
	}
	return 0, false
}
