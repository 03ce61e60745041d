package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/internal/reshard"
	"github.com/spf13/cobra"
)

// shardsCommand is `beatd shards show|resize M`: a cluster's shard count,
// and its offline resize.
func shardsCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "shards show|resize M",
		Short: "show a cluster's shard count, or resize a stopped cluster to M shards",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	etcd := etcdflags.Flags{Prefix: keys.DefaultPrefix}
	var (
		asJSON  bool
		timeout time.Duration
		brk     statusBroker
	)
	show := &cobra.Command{
		Use:   "show",
		Short: "print the shard count, and a resize in progress or unfinished",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			cli, err := etcd.Client()
			if err != nil {
				fmt.Fprintln(stderr, "beatd shards:", termErr(err))
				return codeErr(exitFail)
			}
			defer cli.Close()
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			info, err := reshard.Show(rctx, cli, etcd.KeyPrefix())
			if err != nil {
				fmt.Fprintln(stderr, "beatd shards:", termErr(etcd.Failure("read the shard count", timeout, err)))
				return codeErr(exitFail)
			}
			if asJSON {
				_ = json.NewEncoder(stdout).Encode(info)
				return nil
			}
			fmt.Fprintf(stdout, "shards: %d\n", info.Count)
			if r := info.Resizing; r != nil {
				fmt.Fprintf(stdout, "resize: %s\n", r)
			}
			return nil
		},
	}
	resize := &cobra.Command{
		Use:   "resize M",
		Short: "move a stopped cluster's entries' state to M shards (1 to 256) and record M",
		Long: `resize moves every entry's state from its shard's table to its shard's table
among M, and records M (M = 1 leaves an unsharded cluster, key for key). It is
offline: stop every replica first; it refuses while any replica is registered
or any election has a holder, and replicas refuse to start while it runs.
A resize that dies is finished by running it again with the same M.
Then start every replica with --shards M.

--broker is the cluster's broker. On Redis, resize raises every shard's
fence above the tokens of the old count before anything moves, so a replica
paused through the resize (not stopped) cannot publish when it wakes; on
RabbitMQ each term is checked in etcd, and nothing is raised.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			m, err := strconv.Atoi(args[0])
			if err != nil {
				return usageError{c, fmt.Errorf("M %q: want a shard count, 1 to %d", args[0], reshard.MaxShards)}
			}
			if err := reshard.CheckCount(m); err != nil {
				fmt.Fprintln(stderr, "beatd shards resize:", termErr(err))
				return codeErr(exitFail)
			}
			cli, err := etcd.Client()
			if err != nil {
				fmt.Fprintln(stderr, "beatd shards resize:", termErr(err))
				return codeErr(exitFail)
			}
			defer cli.Close()
			raise, closeBroker, err := brk.fenceRaiser(keys.Cluster(etcd.KeyPrefix()))
			if err != nil {
				fmt.Fprintln(stderr, "beatd shards resize:", termErr(err))
				return codeErr(exitFail)
			}
			defer closeBroker()
			// --timeout bounds each step, not the whole resize: a million
			// entries are thousands of steps.
			host, _ := os.Hostname()
			res, err := reshard.Resize(ctx, reshard.Options{Client: cli, Prefix: etcd.KeyPrefix(), To: m,
				By: fmt.Sprintf("%s pid %d", host, os.Getpid()), RaiseFences: raise, StepTimeout: timeout,
				Logger: slog.New(slog.NewTextHandler(stderr, nil))})
			if err != nil {
				if !errors.Is(err, reshard.ErrRefused) {
					err = etcd.Failure("resize", timeout, err)
				}
				fmt.Fprintln(stderr, "beatd shards resize:", termErr(err))
				return codeErr(exitFail)
			}
			if asJSON {
				_ = json.NewEncoder(stdout).Encode(res)
				return nil
			}
			resumed := ""
			if res.Resumed {
				resumed = " (finished an unfinished resize)"
			}
			fmt.Fprintf(stdout, "resized %d -> %d shards: %d entries' state moved in %s%s; start every replica with --shards %d\n",
				res.From, res.To, res.Entries, res.Took.Round(time.Millisecond), resumed, res.To)
			return nil
		},
	}
	for _, sub := range []*cobra.Command{show, resize} {
		fs := flagenv.New("shards "+sub.Name(), stderr)
		etcd.Register(fs)
		fs.BoolVar(&asJSON, "json", false, "print JSON")
		fs.DurationVar(&timeout, "timeout", time.Minute, "deadline for the whole command")
		if sub == resize {
			brk.register(fs)
			fs.Lookup("timeout").Usage = "deadline for each step of the resize: each etcd transaction, each chunk deleted, each table read or written (per 100,000 entries); the whole resize takes as many steps as the cluster needs"
			fs.Lookup("broker").Usage = "the cluster's Celery broker URL (required: on Redis, resize raises the shards' fences)"
		}
		commandFlags(sub, fs)
	}
	root.AddCommand(show, resize)
	return root
}
