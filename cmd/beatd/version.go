package main

import (
	"context"
	"fmt"
	"io"

	"github.com/beatd/beatd/daemon"
)

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	fmt.Fprintf(stdout, "beatd %s\n", daemon.Version())
	return 0
}
