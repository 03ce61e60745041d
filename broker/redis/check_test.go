package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
	"github.com/redis/go-redis/v9"
)

// TestCheckACL runs the start-up check as ACL users on a real Redis: the
// README's least-privilege user passes and publishes (with WAIT); users
// missing one command or one key pattern get an error naming it, at
// start-up rather than at the first fire.
func TestCheckACL(t *testing.T) {
	ctx := context.Background()
	master := testutil.MustStartRedis(t)
	testutil.MustStartReplica(t, master.Addr())
	admin := master.Client()
	task := compileTest(t, "    {task: tasks.add, every: 1s, args: [1, 2]}")
	readme := testutil.DocumentedACL(t, "pw")
	for _, tc := range []struct {
		name    string
		rules   []string // ACL SETUSER arguments after the user name
		wantErr string   // "" means Check passes and a publish works
	}{
		{"README least privilege", readme, ""},
		{"no EVALSHA", append(append([]string{}, readme...), "-evalsha"), "EVALSHA"},
		{"no LPUSH", append(append([]string{}, readme...), "-lpush"), `LPUSH on key "celery"`},
		{"no WAIT", append(append([]string{}, readme...), "-wait"), "WAIT"},
		{"queue key not allowed", []string{"on", ">pw", "resetkeys", "~beatd:*", "~_kombu.binding.*", "+@all"}, `"celery"`},
		{"wrong password", []string{"on", ">other", "+@all", "~*"}, "WRONGPASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []any{"ACL", "SETUSER", "beatd", "reset"}
			for _, r := range tc.rules {
				args = append(args, r)
			}
			if err := admin.Do(ctx, args...).Err(); err != nil {
				t.Fatalf("ACL SETUSER %v: %v", tc.rules, err)
			}
			c := redis.NewClient(&redis.Options{Addr: master.Addr(), Username: "beatd", Password: "pw", MaxRetries: -1})
			defer c.Close()
			// Flush the script cache, as after a Redis restart: Check must
			// load the scripts itself.
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			p := New(c, Options{Cluster: "beatd/test", KeyPrefix: "beatd:{test}:", MinReplicas: 1, MinReplicasTimeout: time.Second})
			err := p.Check(ctx, task)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Check = %v, want an error naming %s", err, tc.wantErr)
				}
				t.Logf("Check: %v", err)
				if IsUnreachable(err) {
					t.Fatalf("a refusal classed as unreachable: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if err := p.RaiseFence(ctx, 5); err != nil {
				t.Fatal(err)
			}
			res := make([]broker.Result, 1)
			if err := p.Publish(ctx, 5, []celery.Fire{{Task: task, Slot: time.Unix(1e9, 0)}}, res); err != nil || res[0] != broker.ResultOK {
				t.Fatalf("publish as the least-privilege user: %v %v", res, err)
			}
			// After a Redis restart the script cache is empty; the fence
			// script falls back to EVAL, the publish to SCRIPT LOAD.
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := p.RaiseFence(ctx, 6); err != nil {
				t.Fatal(err)
			}
			if err := p.Publish(ctx, 6, []celery.Fire{{Task: task, Slot: time.Unix(1e9+1, 0)}}, res); err != nil || res[0] != broker.ResultOK {
				t.Fatalf("publish after SCRIPT FLUSH: %v %v", res, err)
			}
		})
	}
}

func TestIsUnreachable(t *testing.T) {
	port := testutil.FreePort(t) // nothing listens
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1})
	defer c.Close()
	p := New(c, Options{KeyPrefix: "beatd:{test}:"})
	err := p.Check(context.Background())
	if err == nil || !IsUnreachable(err) {
		t.Fatalf("Check on a closed port = %v, want an unreachable error", err)
	}
}
