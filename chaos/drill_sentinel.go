package chaos

import (
	"context"
	"time"

	"github.com/beatd/beatd/testkit/harness"
	"github.com/redis/go-redis/v9"
)

// The parts of a drill that run Redis behind Sentinel (LocalConfig.Sentinel).

func (d *drill) sentinelBroker() string {
	if d.sentinel == nil {
		return ""
	}
	return d.sentinel.URL(0)
}

func (d *drill) masterName() string {
	if d.sentinel == nil {
		return ""
	}
	return d.sentinel.MasterName
}

// brokerClient reaches the Redis the leader publishes to: the one server,
// or the master once a Sentinel topology healed. A failover the sentinels
// started on their own near the end of a drill leaves the new master
// without its replica for seconds, and the leader (waiting for one by
// default) publishes nothing: the audit must not end before it does.
func (d *drill) brokerClient(timeout time.Duration) (*redis.Client, error) {
	if d.sentinel == nil {
		return redis.NewClient(&redis.Options{Addr: d.redis.Addr()}), nil
	}
	m, err := d.sentinel.Heal(timeout)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(&redis.Options{Addr: m.Addr()}), nil
}

// auditClient reaches the Redis whose queue is audited: the one server,
// or the master at the end of a Sentinel drill.
func (d *drill) auditClient(ctx context.Context) (*redis.Client, error) {
	if d.sentinel == nil {
		return redis.NewClient(&redis.Options{Addr: d.redis.Addr()}), nil
	}
	m, err := d.sentinel.Master(ctx)
	if err != nil {
		return nil, err
	}
	d.logf("auditing the final master %s", m.Addr())
	return redis.NewClient(&redis.Options{Addr: m.Addr()}), nil
}

// redisFailover fails the master over, by SENTINEL FAILOVER or kill -9,
// chosen by the drill's seed.
func (d *drill) redisFailover(f *Fault) error {
	start := time.Now()
	var m *harness.RedisProc
	var err error
	if d.rng.IntN(2) == 0 {
		f.Target = "sentinel-failover"
		m, err = d.sentinel.Failover(60 * time.Second)
	} else {
		f.Target = "kill-master"
		m, err = d.sentinel.KillMaster(60 * time.Second)
	}
	f.Held = time.Since(start)
	if err == nil {
		f.Target += "->" + m.Addr()
	}
	return err
}

// restartSentinelReplica is redis-restart with Sentinel: kill -9 the
// replica and restart it, so the master runs without one for a while
// (publishes wait or, with the Sentinel default, go unprotected).
func (d *drill) restartSentinelReplica(ctx context.Context, f *Fault) error {
	r, err := d.sentinel.Replica(ctx)
	if err != nil {
		return err
	}
	f.Target = "replica " + r.Addr()
	r.Kill()
	f.Held = time.Duration(300+d.rng.IntN(1500)) * time.Millisecond
	if err := d.sleep(ctx, f.Held); err != nil {
		return err
	}
	return r.Start()
}
