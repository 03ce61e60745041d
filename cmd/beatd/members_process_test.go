package main

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/status"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestProcessMembersReplicas: `beatd members replicas` shows each replica
// of a running cluster and what it leads, as the elections in etcd say:
// the unsharded leader's token, or each shard a sharded replica leads
// with its shard's token; and after a SIGTERM, the survivor with every
// shard and the stopped replica gone.
func TestProcessMembersReplicas(t *testing.T) {
	// Its own etcd and Redis per case; it compares the command with the
	// elections, and times nothing.
	t.Parallel()
	for _, tc := range []struct {
		name   string
		shards int
	}{
		{name: "unsharded", shards: 1},
		{name: "sharded", shards: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, failoverConfig, 2, "--shards", fmt.Sprint(tc.shards))
			// want is what the elections say, read as the test's own
			// observer: who leads, with which token.
			want := func() (map[string][]shardTerm, map[string]int64) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				byShard, unsharded := map[string][]shardTerm{}, map[string]int64{}
				if tc.shards == 1 {
					if l, err := election.Observe(ctx, c.observer, c.prefix); err == nil {
						unsharded[l.ID] = l.Token
					}
					return byShard, unsharded
				}
				shards, err := status.Shards(ctx, c.observer, c.prefix)
				if err != nil {
					t.Fatal(err)
				}
				for _, sh := range shards {
					if sh.LeaderID != "" {
						byShard[sh.LeaderID] = append(byShard[sh.LeaderID], shardTerm{Shard: sh.Shard, FencingToken: sh.FencingToken})
					}
				}
				return byShard, unsharded
			}
			// check waits until the command's JSON matches the elections
			// read before and after it (so no move fell between), with
			// every shard led and the replicas registered; it returns the
			// listing.
			check := func(ids []string, led map[string]int) replicaList {
				t.Helper()
				var rl replicaList
				var last string
				testutil.Eventually(t, 20*time.Second, "members replicas as the elections say", func() bool {
					before, beforeU := want()
					code, out, errs := c.cli("members", "replicas", "--json")
					if code != 0 {
						last = errs
						return false
					}
					last = out
					after, afterU := want()
					if !reflect.DeepEqual(before, after) || !reflect.DeepEqual(beforeU, afterU) {
						return false
					}
					rl = replicaList{}
					if err := json.Unmarshal([]byte(out), &rl); err != nil {
						t.Fatalf("%v\n%s", err, out)
					}
					if rl.ShardCount != tc.shards || len(rl.Unled) != 0 || len(rl.Replicas) != len(ids) {
						return false
					}
					for i, r := range rl.Replicas {
						n := len(r.Shards)
						if r.LeaderToken != 0 {
							n = 1
						}
						if r.ID != ids[i] || !r.Registered || r.Health != "ok" || n != led[r.ID] ||
							!reflect.DeepEqual(r.Shards, after[r.ID]) || r.LeaderToken != afterU[r.ID] {
							return false
						}
					}
					return true
				})
				if t.Failed() {
					t.Logf("last output: %s", last)
				}
				return rl
			}
			led := map[string]int{"r0": 2, "r1": 2}
			if tc.shards == 1 {
				lead, _ := c.leader("", 20*time.Second)
				led = map[string]int{"r0": 0, "r1": 0, lead.ID: 1}
			}
			rl := check([]string{"r0", "r1"}, led)
			// The table says the same.
			code, out, errs := c.cli("members", "replicas")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			for _, r := range rl.Replicas {
				var cell string
				switch {
				case r.LeaderToken != 0:
					cell = fmt.Sprintf("leader (token %d)", r.LeaderToken)
				case len(r.Shards) > 0:
					cell = fmt.Sprintf("shard %d (token %d)", r.Shards[0].Shard, r.Shards[0].FencingToken)
				default:
					continue
				}
				if !strings.Contains(out, cell) {
					t.Errorf("table lacks %q:\n%s", cell, out)
				}
			}
			if tc.shards > 1 && !strings.Contains(out, "4 shards, every one led") {
				t.Errorf("table lacks the shard count:\n%s", out)
			}
			t.Logf("\n%s", out)
			if tc.shards > 1 {
				// beatd status shows every entry's last result, whichever
				// replica leads its shard: the replica it asks gathers
				// each shard's from that shard's leader.
				var last string
				testutil.Eventually(t, 10*time.Second, "beatd status gives every entry its last result", func() bool {
					code, out, errs := c.cli("status", "--json")
					last = out + errs
					var st status.View
					if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Entries) != 3 || len(st.Shards) != tc.shards {
						return false
					}
					for _, e := range st.Entries {
						if e.LastResult != "ok" || e.LastPublishedAt == nil {
							return false
						}
					}
					for _, sh := range st.Shards {
						if sh.LiveError != "" {
							return false
						}
					}
					return true
				})
				if t.Failed() {
					t.Fatalf("beatd status: %s", last)
				}
			}
			// r1 stops: r0 leads everything, and r1 is gone.
			c.replicas[1].Signal(syscall.SIGTERM)
			<-c.replicas[1].Done()
			check([]string{"r0"}, map[string]int{"r0": tc.shards})
		})
	}
}
