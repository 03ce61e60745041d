package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/status"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// replicaList is `beatd members replicas`: the registered replicas of a
// beatd cluster and what each leads. Who leads is read from the elections
// themselves (the unsharded one, or every shard's), not from the
// registrations, which are refreshed only every few seconds: a shard
// moved a moment ago shows under its new leader.
type replicaList struct {
	// ShardCount is the cluster's shard count (1: unsharded).
	ShardCount int           `json:"shard_count"`
	Replicas   []replicaInfo `json:"replicas"`
	// Unled are the shards (of a sharded cluster) nobody leads now; on an
	// unsharded cluster, [0] while there is no leader.
	Unled []int `json:"unled_shards"`
}

// replicaInfo is one replica: its registration, and its terms.
type replicaInfo struct {
	ID      string    `json:"id"`
	HTTP    string    `json:"http"`
	Version string    `json:"version,omitempty"`
	Health  string    `json:"health"`
	Broker  string    `json:"broker,omitempty"`
	Updated time.Time `json:"updated,omitzero"`
	// Registered is false for a replica that holds an election but has
	// no registration (it has just started, or its registration lapsed).
	Registered bool `json:"registered"`
	// LeaderToken is its term's token while it leads an unsharded
	// cluster, else 0.
	LeaderToken int64 `json:"leader_token,omitempty"`
	// Shards are the shards it leads, each with its term's token.
	Shards []shardTerm `json:"shards,omitempty"`
}

// shardTerm is one shard a replica leads.
type shardTerm struct {
	Shard        int   `json:"shard"`
	FencingToken int64 `json:"fencing_token"`
}

// listReplicas joins the registry with the elections of the cluster at
// prefix.
func listReplicas(ctx context.Context, cli *clientv3.Client, prefix string) (replicaList, error) {
	var rl replicaList
	reps, err := election.Replicas(ctx, cli, prefix)
	if err != nil {
		return rl, err
	}
	rl.Replicas = make([]replicaInfo, 0, len(reps))
	idx := map[string]int{}
	for i, r := range reps {
		idx[r.ID] = i
		rl.Replicas = append(rl.Replicas, replicaInfo{ID: r.ID, HTTP: r.URL(), Version: r.Version, Health: r.Health,
			Broker: r.Broker, Updated: r.Updated, Registered: true})
	}
	// find is replica id, added unregistered when the registry has none:
	// an election's holder is shown whether or not it registered.
	find := func(id string) *replicaInfo {
		i, ok := idx[id]
		if !ok {
			i, idx[id] = len(rl.Replicas), len(rl.Replicas)
			rl.Replicas = append(rl.Replicas, replicaInfo{ID: id, Health: "not registered"})
		}
		return &rl.Replicas[i]
	}
	shards, err := status.Shards(ctx, cli, prefix)
	if err != nil {
		return rl, err
	}
	rl.ShardCount = max(len(shards), 1)
	if len(shards) == 0 {
		l, err := election.Observe(ctx, cli, prefix)
		switch {
		case errors.Is(err, election.ErrNoLeader):
			rl.Unled = []int{0}
		case err != nil:
			return rl, err
		default:
			find(l.ID).LeaderToken = l.Token
		}
	}
	for _, sh := range shards {
		if sh.LeaderID == "" {
			rl.Unled = append(rl.Unled, sh.Shard)
			continue
		}
		ri := find(sh.LeaderID)
		ri.Shards = append(ri.Shards, shardTerm{Shard: sh.Shard, FencingToken: sh.FencingToken})
	}
	sort.SliceStable(rl.Replicas, func(i, j int) bool { return rl.Replicas[i].ID < rl.Replicas[j].ID })
	return rl, nil
}

// printReplicas writes rl as a table, a replica a row.
func printReplicas(w io.Writer, rl replicaList) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tHTTP\tVERSION\tHEALTH\tBROKER\tLEADS")
	for _, r := range rl.Replicas {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", term(r.ID), dash(r.HTTP), dash(r.Version), oneLine(r.Health, 60),
			cmpDash(oneLine(r.Broker, 40)), leads(r))
	}
	_ = tw.Flush()
	switch {
	case rl.ShardCount > 1 && len(rl.Unled) > 0:
		fmt.Fprintf(w, "%d shards; nobody leads shards %s now\n", rl.ShardCount, joinInts(rl.Unled))
	case rl.ShardCount > 1:
		fmt.Fprintf(w, "%d shards, every one led\n", rl.ShardCount)
	case len(rl.Unled) > 0:
		fmt.Fprintln(w, "nobody leads now: an election is under way")
	}
}

// leads is a replica's LEADS cell: "shard 0 (token 12), shard 3 (token
// 15)", "leader (token 7)" or "-".
func leads(r replicaInfo) string {
	if r.LeaderToken != 0 {
		return "leader (token " + strconv.FormatInt(r.LeaderToken, 10) + ")"
	}
	if len(r.Shards) == 0 {
		return "-"
	}
	parts := make([]string, len(r.Shards))
	for i, sh := range r.Shards {
		parts[i] = fmt.Sprintf("shard %d (token %d)", sh.Shard, sh.FencingToken)
	}
	return strings.Join(parts, ", ")
}

func cmpDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ", ")
}
