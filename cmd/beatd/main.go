// Command beatd is a highly available replacement for Celery's celery beat.
//
// main only wires things together; each subcommand lives in its own file,
// and cli.go builds the command tree.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
