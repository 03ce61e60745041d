package main

import (
	"context"
	"fmt"
	"io"

	"github.com/beatd/beatd/internal/version"
)

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	fmt.Fprintf(stdout, "beatd %s\n", version.String())
	return 0
}
