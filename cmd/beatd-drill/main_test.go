package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/testkit/testutil"
)

// TestAuditDeadBroker: audit gives up within its --timeout and names the
// broker.
func TestAuditDeadBroker(t *testing.T) {
	dead := "redis://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t)) + "/0"
	start := time.Now()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"audit", "--broker", dead, "--config", "../../schedules.yaml", "--from", "2026-01-01T00:00:00Z", "--timeout", "1s"}, &out, &errb)
	if code != exitFail || !strings.Contains(errb.String(), "broker at "+dead) {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
	// The deadline is 1s; generous slack for a loaded machine.
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("took %s with --timeout 1s", took)
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
	}{
		{name: "no command", args: nil, code: exitUsage},
		{name: "unknown command", args: []string{"fly"}, code: exitUsage},
		{name: "help", args: []string{"--help"}, code: exitOK},
		{name: "audit without config", args: []string{"audit", "--from", "2026-01-01T00:00:00Z"}, code: exitUsage},
		{name: "audit bad flag", args: []string{"audit", "--nope"}, code: exitUsage},
		{name: "local sentinel on amqp", args: []string{"local", "--beatd", "/bin/true", "--sentinel", "--broker", "amqp"}, code: exitUsage},
		{name: "local too many shards", args: []string{"local", "--beatd", "/bin/true", "--shards", "17"}, code: exitFail},
		{name: "local shard-move without enough shards", args: []string{"local", "--beatd", "/bin/true", "--shards", "3", "--faults", "shard-move"}, code: exitFail},
		{name: "local sharded kind unsharded", args: []string{"local", "--beatd", "/bin/true", "--faults", "resize"}, code: exitFail},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tt.args, &out, &errb); code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, errb.String())
			}
		})
	}
}

// TestHiddenSeed: without --seed the drill names no seed before its end,
// and the end (here a refused configuration) names the one it drew; a
// given seed is shown at once.
func TestHiddenSeed(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"local", "--beatd", "/bin/true", "--shards", "17"}, &out, &errb); code != exitFail {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(out.String(), "seed hidden until the report") || !strings.Contains(errb.String(), "(seed ") {
		t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	run(context.Background(), []string{"local", "--beatd", "/bin/true", "--shards", "17", "--seed", "42"}, &out, &errb)
	if !strings.Contains(out.String(), "drill: seed 42,") || !strings.Contains(errb.String(), "(seed 42)") {
		t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
	}
}
