package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/internal/keys"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// memberInfo is one etcd member as `beatd members list` shows it.
type memberInfo struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	Started    bool     `json:"started"`
	Leader     bool     `json:"raft_leader"`
	Learner    bool     `json:"learner"`
	Healthy    bool     `json:"healthy"`
	PeerURLs   []string `json:"peer_urls"`
	ClientURLs []string `json:"client_urls"`
}

// runMembers is `beatd members list|add|remove`: the etcd membership of an
// embedded cluster (or of any etcd), for scaling and repairs.
func runMembers(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintln(stderr, `usage: beatd members list [--json]
       beatd members replicas [--json]          the beatd replicas, and what each leads (its shards and tokens)
       beatd members add NAME --peer-url URL   add a member before starting its replica
       beatd members remove NAME|ID             remove a member whose replica is gone for good
The etcd flags (--etcd-endpoints, TLS, auth) select the cluster; the default is http://127.0.0.1:2379,
the embedded member's client port inside a beatd pod.`)
		return 2
	}
	if code, done := subcommandHelp(args, usage); done {
		return code
	}
	sub := args[0]
	fs := flagenv.New("members "+sub, stderr)
	ef := etcdflags.Flags{Prefix: keys.DefaultPrefix}
	ef.Register(fs)
	jsonOut := fs.Bool("json", false, "print JSON")
	peerURL := fs.String("peer-url", "", "the new member's advertise peer URL (add)")
	// The name comes first, flags after it, as in `beatd trigger NAME`.
	var pos []string
	rest := args[1:]
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		pos, rest = rest[:1], rest[1:]
	}
	if err := flagenv.Parse(fs, rest); err != nil {
		return exitCode(err)
	}
	pos = append(pos, fs.Args()...)
	cli, err := ef.Client()
	if err != nil {
		fmt.Fprintln(stderr, "beatd members:", termErr(err))
		return 1
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	switch {
	case sub == "list" && len(pos) == 0:
		ms, err := listMembers(ctx, cli)
		if err != nil {
			fmt.Fprintln(stderr, "beatd members:", termErr(err))
			return 1
		}
		if *jsonOut {
			b, _ := json.MarshalIndent(ms, "", "  ")
			fmt.Fprintln(stdout, string(b))
			return 0
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tRAFT LEADER\tPEER URLS\tCLIENT URLS")
		for _, m := range ms {
			status := "unstarted"
			switch {
			case m.Started && m.Healthy:
				status = "healthy"
			case m.Started:
				status = "unreachable"
			}
			if m.Learner {
				status += " (learner)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\n", m.ID, dash(m.Name), status, m.Leader, dash(strings.Join(m.PeerURLs, ",")), dash(strings.Join(m.ClientURLs, ",")))
		}
		tw.Flush()
		return 0
	case sub == "replicas" && len(pos) == 0:
		rl, err := listReplicas(ctx, cli, ef.KeyPrefix())
		if err != nil {
			fmt.Fprintln(stderr, "beatd members:", termErr(err))
			return 1
		}
		if *jsonOut {
			_ = printJSON(stdout, rl)
			return 0
		}
		printReplicas(stdout, rl)
		return 0
	case sub == "add" && len(pos) == 1:
		if *peerURL == "" {
			fmt.Fprintln(stderr, "beatd members add: --peer-url is required")
			return 2
		}
		resp, err := cli.MemberAdd(ctx, []string{*peerURL})
		if err != nil {
			fmt.Fprintln(stderr, "beatd members add:", termErr(err))
			return 1
		}
		var ic []string
		for _, m := range resp.Members {
			name := m.Name
			if m.ID == resp.Member.ID {
				name = pos[0]
			} else if name == "" {
				name = fmt.Sprintf("%x", m.ID)
			}
			for _, u := range m.PeerURLs {
				ic = append(ic, name+"="+u)
			}
		}
		fmt.Fprintf(stdout, "added member %s (%x); start its replica with --etcd-name %s.\n", term(pos[0]), resp.Member.ID, term(pos[0]))
		fmt.Fprintf(stdout, "the cluster now: %s\n", term(strings.Join(ic, ",")))
		return 0
	case sub == "remove" && len(pos) == 1:
		ms, err := listMembers(ctx, cli)
		if err != nil {
			fmt.Fprintln(stderr, "beatd members remove:", termErr(err))
			return 1
		}
		var id uint64
		for _, m := range ms {
			if m.Name == pos[0] || m.ID == strings.ToLower(pos[0]) {
				id, _ = strconv.ParseUint(m.ID, 16, 64)
			}
		}
		if id == 0 {
			fmt.Fprintf(stderr, "beatd members remove: no member named %q (see beatd members list)\n", pos[0])
			return 1
		}
		if _, err := cli.MemberRemove(ctx, id); err != nil {
			fmt.Fprintln(stderr, "beatd members remove:", termErr(err))
			if errors.Is(err, rpctypes.ErrUnhealthy) {
				// etcd counts a member healthy only after 5 s connected,
				// so this passes on its own once a restart settles.
				fmt.Fprintln(stderr, "etcd keeps a quorum of members connected for 5 s before removing one; retry in a few seconds")
			}
			return 1
		}
		fmt.Fprintf(stdout, "removed member %s (%x)\n", term(pos[0]), id)
		return 0
	}
	return usage()
}

// listMembers reads the member list and asks each started member for its
// status.
func listMembers(ctx context.Context, cli *clientv3.Client) ([]memberInfo, error) {
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("member list: %w", err)
	}
	var out []memberInfo
	for _, m := range resp.Members {
		mi := memberInfo{ID: fmt.Sprintf("%x", m.ID), Name: m.Name, Started: len(m.ClientURLs) > 0, Learner: m.IsLearner,
			PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs}
		if mi.Started {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := cli.Status(sctx, m.ClientURLs[0])
			cancel()
			mi.Healthy = err == nil && st.Header.MemberId == m.ID // not another member at a reused URL
			mi.Leader = err == nil && st.Leader == m.ID
		}
		out = append(out, mi)
	}
	return out, nil
}
