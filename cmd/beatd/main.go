// Command beatd is a highly available replacement for Celery's celery beat.
//
// main only wires things together; each subcommand lives in its own file.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/beatd/beatd/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one beatd subcommand. It returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"run", "run the scheduler (leader election, publishing, HTTP)", runRun},
		{"validate", "check a schedules.yaml; exit 1 with FILE:LINE:COL errors", runValidate},
		{"next", "print the next fire times of each entry", runNext},
		{"status", "show the leader and every entry's state, from etcd", runStatus},
		{"trigger", "ask the leader to publish an entry now", runAdmin(store.OpTrigger)},
		{"pause", "pause an entry (survives failover)", runAdmin(store.OpPause)},
		{"resume", "resume a paused entry", runAdmin(store.OpResume)},
		{"drill", "failover drills with an exactly-once audit (local, audit)", runDrill},
		{"members", "list, add or remove etcd members (embedded cluster mode)", runMembers},
		{"version", "print the version", runVersion},
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "beatd: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: beatd COMMAND [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'beatd COMMAND -h' for a command's flags.")
}
