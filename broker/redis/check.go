package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/internal/tlsfiles"
	"github.com/redis/go-redis/v9"
)

// ErrClusterUnsupported means the broker is a Redis Cluster node. beatd
// refuses it: Celery's Redis transport (Kombu) has no Cluster support, so
// no worker could consume what beatd pushed, and WAIT on a cluster
// connection says nothing about the node that took the write.
var ErrClusterUnsupported = errors.New("the broker is a Redis Cluster node; Redis Cluster is not supported (Celery's Redis transport has no Cluster support either): use a single master, with replicas and Sentinel for HA")

// aclProbeScript asks Redis whether this connection's user may run each
// command in ARGV, without running any. ARGV is a flat list of commands,
// each as its argument count followed by its arguments (the command name
// first). It returns the first denied command's index (1-based) or 0.
// Redis before 7.0 has no redis.acl_check_cmd: then it returns -1 and the
// probe is skipped. (Every command must come with valid arguments: Redis
// 7.0.15 crashes on acl_check_cmd('evalsha') without any.)
var aclProbeScript = redis.NewScript(`
if not redis.acl_check_cmd then return -1 end
local i, n = 1, 0
while i <= #ARGV do
  local argc = tonumber(ARGV[i])
  n = n + 1
  if not redis.acl_check_cmd(unpack(ARGV, i + 1, i + argc)) then return n end
  i = i + argc + 1
end
return 0
`)

// Check is the start-up probe: it fails with a clear error if beatd
// cannot publish to this broker for a reason that will not heal on its
// own (TLS, authentication, ACL permissions, a Redis Cluster), rather than
// at the first fire. tasks are the compiled entries whose queue and
// binding keys it checks; one per distinct queue is enough. An error for
// which IsUnreachable is true may heal (the broker is down or slow).
//
// It loads the scripts, runs the fence script with token -1 (a fenced
// no-op: it only reads the fence), and asks Redis' ACL whether every
// command a publish's transaction and the WAIT step run is allowed on
// their keys.
func (p *Publisher) Check(ctx context.Context, tasks ...*celery.Task) error {
	if err := p.rdb.Ping(ctx).Err(); err != nil {
		if errors.Is(err, redis.Nil) {
			// Sentinels answered, without an address for the master name.
			return fmt.Errorf("ping: the sentinels know no master of that name (--broker-master-name): %w", err)
		}
		if IsUnreachable(err) {
			if terr := p.refusedTLS(); terr != nil {
				return fmt.Errorf("TLS handshake: %w", terr)
			}
		}
		return fmt.Errorf("ping: %w", err)
	}
	// A least-privilege user may not run INFO; then the probes below find
	// a cluster by its MOVED or CROSSSLOT replies instead.
	if info, err := p.rdb.Info(ctx, "cluster").Result(); err == nil && strings.Contains(info, "cluster_enabled:1") {
		return ErrClusterUnsupported
	}
	for _, s := range []*redis.Script{fenceScript, aclProbeScript} {
		if err := s.Load(ctx, p.rdb).Err(); err != nil {
			return checkErr("load the publish scripts (SCRIPT LOAD)", err)
		}
	}
	if err := fenceScript.EvalSha(ctx, p.rdb, []string{p.fenceKey}, -1).Err(); err != nil {
		return checkErr("run the fence script (EVALSHA)", err)
	}
	uses := p.aclUses(tasks)
	var args []any
	for _, u := range uses {
		args = append(args, len(u))
		for _, a := range u {
			args = append(args, a)
		}
	}
	denied, err := aclProbeScript.EvalSha(ctx, p.rdb, nil, args...).Int()
	if err != nil {
		return checkErr("probe ACL permissions", err)
	}
	if denied > 0 {
		u := uses[denied-1]
		return fmt.Errorf("the broker user may not run %s (NOPERM); see docs/brokers.md's ACL SETUSER line for what beatd needs", describeUse(u))
	}
	if p.repl.want == ReplicasAuto {
		if err := p.repl.count(ctx, p.rdb); err != nil {
			return checkErr("count the master's replicas", err)
		}
	}
	return nil
}

// refusedTLS tells a server that refuses this client's TLS certificate
// from one that is down, for a plain TLS client. Redis says nothing until
// it is asked, so an accepted handshake costs the full wait: it runs only
// after a failed ping.
func (p *Publisher) refusedTLS() error {
	c, ok := p.rdb.(*redis.Client)
	if !ok {
		return nil
	}
	o := c.Options()
	if o.TLSConfig == nil || o.Network == "unix" {
		return nil
	}
	return tlsfiles.RefusedHandshake(o.Addr, o.TLSConfig, time.Second)
}

func checkErr(what string, err error) error {
	if msg := err.Error(); strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "CROSSSLOT") || strings.HasPrefix(msg, "CLUSTERDOWN") {
		return fmt.Errorf("%s: %w (%v)", what, ErrClusterUnsupported, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// IsUnreachable reports whether err says the broker could not be reached
// (refused, reset, timed out), which may heal, as opposed to a refusal
// that will not (TLS, authentication, permissions).
func IsUnreachable(err error) bool {
	if errors.Is(err, redis.Nil) {
		return false // a sentinel answered: it has no such master
	}
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) ||
		strings.Contains(err.Error(), "redis: all sentinels specified in configuration are unreachable")
}

// aclUses lists every command beatd runs on the broker, with the keys it
// runs them on: a publish's transaction, the fence script and what it
// runs, and the WAIT step.
func (p *Publisher) aclUses(tasks []*celery.Task) [][]string {
	dedup, trigger, entries := p.DedupKey([36]byte{}), p.TriggerKey("probe"), p.entriesKey()
	history, counts := p.historyKey("probe"), p.countsKey()
	backfill := p.BackfillKey("probe")
	uses := [][]string{
		{"watch", p.fenceKey},
		{"multi"},
		{"exec"},
		{"unwatch"},
		{"evalsha", fenceScript.Hash(), "3", p.fenceKey, p.slotsTermKey(), p.legacyKey()},
		{"eval", "return 0", "1", p.fenceKey},
		{"script", "load", "return 0"},
		{"get", p.fenceKey},
		{"set", p.fenceKey, "1"},
		{"exists", p.legacyKey()},
		{"hset", entries, "probe", "1"},
		{"hdel", entries, "probe"},
		{"hget", counts, "probe"},
		{"hdel", counts, "probe"},
		{"set", trigger, "1", "NX", "PX", "1"},
		{"del", trigger},
		{"exists", dedup},
		{"set", dedup, "1", "PX", "1"},
		{"get", backfill},
		{"set", backfill, "1", "PX", "1"},
	}
	seen := map[string]bool{}
	for _, t := range tasks {
		if k := t.QueueKey + "\x00" + t.BindingKey; !seen[k] {
			seen[k] = true
			uses = append(uses,
				[]string{"type", t.QueueKey},
				[]string{"sadd", t.BindingKey, "x"},
				[]string{"lpush", t.QueueKey, "x"})
		}
	}
	// The run history, after the queues: a missing LPUSH is named for
	// the queue, where it matters most.
	uses = append(uses,
		[]string{"watch", history},
		[]string{"lindex", history, "0"},
		[]string{"lpush", history, "x"},
		[]string{"ltrim", history, "0", "1"},
		[]string{"lrange", history, "0", "1"},
		[]string{"del", history},
		[]string{"hlen", entries},
		[]string{"hmget", counts, "probe"})
	if p.repl.want != 0 {
		uses = append(uses, []string{"set", p.repl.syncKey, "1"}, []string{"wait", "0", "0"})
	}
	if p.repl.want == ReplicasAuto {
		uses = append(uses, []string{"info", "replication"})
	}
	return uses
}

// describeUse names a probed command for an error: "LPUSH on key celery".
func describeUse(u []string) string {
	name := strings.ToUpper(u[0])
	switch u[0] {
	case "evalsha", "eval":
		if n := len(u) - 3; n > 0 {
			return fmt.Sprintf("%s on keys %q", name, u[3:])
		}
		return name
	case "script":
		return "SCRIPT LOAD"
	case "wait", "info":
		return name
	}
	return fmt.Sprintf("%s on key %q", name, u[1])
}
