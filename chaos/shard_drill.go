package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/beatd/beatd/internal/etcdscan"
	"github.com/beatd/beatd/internal/keys"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Sharded fault kinds (LocalConfig.Shards > 1).
const (
	// FaultShardMove starts the spare replica, waits until the others
	// have handed it its share, and SIGTERMs it, which hands its shards
	// back.
	FaultShardMove = "shard-move"
	// FaultResize is the offline resize as docs/shards.md states it:
	// SIGTERM every replica, `beatd shards resize M` (M drawn from the
	// seed: half or twice the count, 2 to 16), every replica restarted
	// with --shards M. The schedule keeps slots coming due meanwhile.
	FaultResize = "resize"
	// FaultShardPause SIGSTOPs a replica that leads shards until every
	// one of them is led by another replica (past the lease TTL), and
	// then a little longer, before SIGCONT: once it wakes, nothing it
	// publishes under its old terms may reach the queue.
	FaultShardPause = "shard-pause"
)

// ShardFaults lists every fault kind of a sharded drill on Redis: the
// replica faults strike a replica that leads shards (stop becomes
// shard-pause, which checks the takeover), the etcd and broker faults
// the cluster. broker-partition runs only by name: a shard leader cut
// from the broker keeps its shards (docs/shards.md).
var ShardFaults = []string{FaultKill, FaultTerm, FaultEtcdKill, FaultEtcdQuorum, FaultRedisRestart, FaultPartition,
	FaultShardMove, FaultResize, FaultShardPause}

// AMQPShardFaults is ShardFaults on RabbitMQ.
var AMQPShardFaults = []string{FaultKill, FaultTerm, FaultEtcdKill, FaultEtcdQuorum, FaultRabbitRestart, FaultPartition,
	FaultShardMove, FaultResize, FaultShardPause}

// maxDrillShards bounds a drill's shard count, and the counts a resize
// draws.
const maxDrillShards = 16

func shardFaults(broker string) []string {
	if broker == BrokerAMQP {
		return AMQPShardFaults
	}
	return ShardFaults
}

func isShardFault(kind string) bool {
	return kind == FaultShardMove || kind == FaultResize || kind == FaultShardPause
}

// shardDrill is what a sharded drill keeps beside the unsharded one's.
type shardDrill struct {
	spare *Replica // started and stopped by shard-move
	// epochs are the shard counts the cluster ran at, oldest first: a
	// term whose token is at least an epoch's rev ran at its count
	// (every term after a resize is elected after it).
	epochs []shardEpoch
	pauses []pause
	stuck  []string
	// unbalanced are joins that got their share while the others were
	// not balanced among themselves within 20 s: not a failure.
	unbalanced []string
}

type shardEpoch struct {
	count int
	rev   int64
}

// pause is one shard-pause: when the replica stopped, and the terms it
// held then, fenced by the takeover before it woke.
type pause struct {
	at     time.Time
	tokens map[int64]int // token -> shard
}

// count is the current shard count.
func (s *shardDrill) count() int { return s.epochs[len(s.epochs)-1].count }

// countAt is the shard count a term of this token ran at.
func (s *shardDrill) countAt(token int64) int {
	n := s.epochs[0].count
	for _, e := range s.epochs {
		if token >= e.rev {
			n = e.count
		}
	}
	return n
}

// holder is who leads one shard, and with which token ("" for nobody).
type holder struct {
	id    string
	token int64
}

// shardLeaders reads every shard's election (each shard's candidates,
// one snapshot): the oldest candidate key of each shard leads (as the
// replicas' own view).
func (d *drill) shardLeaders(ctx context.Context) ([]holder, error) {
	n := d.shards.count()
	octx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	prefixes := make([]string, n)
	for i := range n {
		prefixes[i] = keys.Leaders(keys.Shard(d.prefix, i, n))
	}
	out := make([]holder, n)
	_, err := etcdscan.Prefixes(octx, d.cli, prefixes, func(i int, kvs []*mvccpb.KeyValue) {
		for _, kv := range kvs {
			if out[i].token == 0 || kv.CreateRevision < out[i].token {
				out[i] = holder{id: string(kv.Value), token: kv.CreateRevision}
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// replica is the drill's replica of this id (nil if none).
func (d *drill) replica(id string) *Replica {
	for _, r := range d.replicas {
		if r.ID == id {
			return r
		}
	}
	return nil
}

// shardTarget waits until a running replica leads shards, and picks one
// of those by the seed; its token is the newest of its terms, so a fire
// under a larger token is a newer term's.
func (d *drill) shardTarget(ctx context.Context, timeout time.Duration) (*Replica, int64, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		hs, err := d.shardLeaders(ctx)
		if err == nil {
			tokens := map[string]int64{}
			for _, h := range hs {
				if r := d.replica(h.id); r != nil && r.Running() {
					tokens[h.id] = max(tokens[h.id], h.token)
				}
			}
			if len(tokens) > 0 {
				ids := slices.Sorted(func(yield func(string) bool) {
					for id := range tokens {
						if !yield(id) {
							return
						}
					}
				})
				id := ids[d.rng.IntN(len(ids))]
				return d.replica(id), tokens[id], nil
			}
		}
		if err := d.sleep(ctx, 50*time.Millisecond); err != nil {
			return nil, 0, err
		}
	}
	return nil, 0, fmt.Errorf("chaos: no replica leads a shard within %s", timeout)
}

// allLed waits until every shard is led by a running replica (besides
// skip) and, when balanced, each of them leads its share; it says how
// long that took, or false at timeout.
func (d *drill) allLed(ctx context.Context, timeout time.Duration, balanced bool, skip *Replica) (time.Duration, bool) {
	began := time.Now()
	for time.Since(began) < timeout {
		if hs, err := d.shardLeaders(ctx); err == nil && d.ledBy(hs, balanced, skip) {
			return time.Since(began), true
		}
		if d.sleep(ctx, 50*time.Millisecond) != nil {
			return 0, false
		}
	}
	return 0, false
}

func (d *drill) ledBy(hs []holder, balanced bool, skip *Replica) bool {
	held := map[string]int{}
	for _, h := range hs {
		r := d.replica(h.id)
		if r == nil || !r.Running() || r == skip {
			return false
		}
		held[h.id]++
	}
	if !balanced {
		return true
	}
	var live int
	for _, r := range d.replicas {
		if r.Running() && r != skip {
			live++
		}
	}
	n := len(hs)
	for _, r := range d.replicas {
		if !r.Running() || r == skip {
			continue
		}
		if c := held[r.ID]; c < n/live || c > (n+live-1)/live {
			return false
		}
	}
	return true
}

// settleShards is run after every fault of a sharded drill: every shard
// must be led by a running replica again within the TTL and a margin for
// the etcd faults' recovery; one that is not is a stuck shard, a failure.
func (d *drill) settleShards(ctx context.Context, f Fault) {
	timeout := d.cfg.LeaseTTL + 30*time.Second
	if _, ok := d.allLed(ctx, timeout, false, nil); !ok && ctx.Err() == nil {
		hs, _ := d.shardLeaders(ctx)
		msg := fmt.Sprintf("after %s at %s: shards not led by a running replica within %s: %v", f.Kind, f.At.UTC().Format(time.RFC3339Nano), timeout, hs)
		d.logf("STUCK %s", msg)
		d.shards.stuck = append(d.shards.stuck, msg)
	}
}

// injectShard applies one of the sharded kinds.
func (d *drill) injectShard(ctx context.Context, f *Fault, lead *Replica) error {
	ttl := d.cfg.LeaseTTL
	switch f.Kind {
	case FaultShardMove:
		spare := d.shards.spare
		f.Target = spare.ID
		if err := spare.Start(); err != nil {
			return err
		}
		// The others hand the spare its share, one shard per balance
		// round each.
		took, ok := d.allLed(ctx, 20*time.Second, true, nil)
		if !ok {
			// Its share is the guarantee; the others' balance among
			// themselves also needs each of them to reach etcd, which a
			// fault just before may still deny one of (reported apart).
			hs, _ := d.shardLeaders(ctx)
			led := 0
			for _, h := range hs {
				if h.id == spare.ID {
					led++
				}
			}
			live := 0
			for _, r := range d.replicas {
				if r.Running() {
					live++
				}
			}
			what := fmt.Sprintf("shard-move at %s: %s joined; not balanced within 20s: %v", f.At.UTC().Format(time.RFC3339Nano), spare.ID, hs)
			if led < len(hs)/live || !d.ledBy(hs, false, nil) {
				d.shards.stuck = append(d.shards.stuck, what)
			} else {
				d.shards.unbalanced = append(d.shards.unbalanced, what)
			}
		}
		hold := time.Duration(1000+d.rng.IntN(2000)) * time.Millisecond
		if err := d.sleep(ctx, hold); err != nil {
			return err
		}
		spare.Signal(syscall.SIGTERM)
		if !spare.Wait(15 * time.Second) {
			spare.Kill()
			d.shards.stuck = append(d.shards.stuck, fmt.Sprintf("shard-move at %s: %s did not exit within 15s of SIGTERM", f.At.UTC().Format(time.RFC3339Nano), spare.ID))
		}
		f.Held = time.Since(f.At)
		d.logf("shard-move: %s balanced in %s, held %s, left", spare.ID, took.Round(time.Millisecond), hold)
		return nil
	case FaultShardPause:
		p := pause{at: time.Now(), tokens: map[int64]int{}}
		lead.Signal(syscall.SIGSTOP)
		// Read once it is stopped: it can win no shard after this (a key
		// of its that becomes the oldest is still its term, and counted).
		hs, err := d.shardLeaders(ctx)
		if err != nil {
			lead.Signal(syscall.SIGCONT)
			return err
		}
		for i, h := range hs {
			if h.id == lead.ID {
				p.tokens[h.token] = i
			}
		}
		// Past the TTL until others lead every shard it led, then a
		// seeded while longer, so it wakes into fenced terms.
		took, ok := d.allLed(ctx, ttl+20*time.Second, false, lead)
		if !ok {
			hs, _ := d.shardLeaders(ctx)
			d.shards.stuck = append(d.shards.stuck, fmt.Sprintf("shard-pause at %s: %s's shards not taken within %s: %v",
				f.At.UTC().Format(time.RFC3339Nano), lead.ID, ttl+20*time.Second, hs))
		}
		serr := d.sleep(ctx, time.Duration(500+d.rng.IntN(1500))*time.Millisecond)
		lead.Signal(syscall.SIGCONT)
		f.Held = time.Since(p.at)
		if ok {
			f.Elected = took // every shard it led, led by another
		}
		d.shards.pauses = append(d.shards.pauses, p)
		d.logf("shard-pause: %s's %d shards taken %s after SIGSTOP", lead.ID, len(p.tokens), took.Round(time.Millisecond))
		return serr
	case FaultResize:
		return d.resize(ctx, f)
	}
	return fmt.Errorf("chaos: %q is not a sharded fault", f.Kind)
}

// resize runs the offline resize: SIGTERM every replica, `beatd shards
// resize M`, every replica restarted with --shards M.
func (d *drill) resize(ctx context.Context, f *Fault) error {
	from := d.shards.count()
	var options []int
	for _, m := range []int{from / 2, from * 2} {
		// More shards than replicas, the spare included, so a shard-move
		// after it still moves shards.
		if m >= 2 && m > d.cfg.Replicas+1 && m <= maxDrillShards {
			options = append(options, m)
		}
	}
	if len(options) == 0 {
		return fmt.Errorf("chaos: no shard count to resize %d shards to (half or twice, %d to %d)", from, d.cfg.Replicas+2, maxDrillShards)
	}
	to := options[d.rng.IntN(len(options))]
	f.Target = fmt.Sprintf("%d->%d", from, to)
	var restart []*Replica
	for _, r := range d.replicas {
		if r.Running() {
			restart = append(restart, r)
		}
	}
	stopAll := func() {
		for _, r := range restart {
			r.Signal(syscall.SIGTERM)
		}
		for _, r := range restart {
			if !r.Wait(15 * time.Second) {
				r.Kill()
			}
		}
	}
	stopAll()
	stopped := time.Since(f.At)
	// A replica that had to be killed keeps its registration for a TTL:
	// the resize refuses until then. On RabbitMQ it also refuses while a
	// shard's last term ended without its state write (a lost lease): as
	// docs/shards.md says, the cluster is then led once more at the old
	// count and stopped again.
	var out []byte
	var err error
	settles := 0
	for began := time.Now(); ; {
		cmd := exec.CommandContext(ctx, d.cfg.Binary, "shards", "resize", strconv.Itoa(to), "--etcd-endpoints", strings.Join(d.etcd.Endpoints(), ","),
			"--prefix", d.prefix, "--broker", d.brokerURL(), "--timeout", "30s")
		if out, err = cmd.CombinedOutput(); err == nil || time.Since(began) > d.cfg.LeaseTTL+30*time.Second {
			break
		}
		if bytes.Contains(out, []byte("ended without writing its state")) && settles < 3 {
			settles++
			d.logf("resize %d->%d refused until a shard is led again at %d: %s", from, to, from, strings.TrimSpace(string(out)))
			for _, r := range restart {
				if err := r.Start(); err != nil {
					return err
				}
			}
			d.allLed(ctx, 30*time.Second, false, nil)
			stopAll()
			began = time.Now()
			continue
		}
		if serr := d.sleep(ctx, 250*time.Millisecond); serr != nil {
			return serr
		}
	}
	if err != nil {
		return fmt.Errorf("chaos: beatd shards resize %d: %w\n%s", to, err, out)
	}
	resized := time.Since(f.At)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := d.cli.Get(rctx, keys.ShardCount(d.prefix))
	cancel()
	if err != nil {
		return fmt.Errorf("chaos: read the shard count after the resize: %w", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != strconv.Itoa(to) {
		return fmt.Errorf("chaos: after `beatd shards resize %d` the cluster records %v", to, resp.Kvs)
	}
	d.shards.epochs = append(d.shards.epochs, shardEpoch{count: to, rev: resp.Header.Revision})
	for _, r := range d.replicas {
		i := slices.Index(r.Args, "--shards")
		r.Args[i+1] = strconv.Itoa(to)
	}
	for _, r := range restart {
		if err := r.Start(); err != nil {
			return err
		}
	}
	// settleShards, after, judges whether every shard is led again.
	d.allLed(ctx, 30*time.Second, false, nil)
	f.Held = time.Since(f.At)
	d.logf("resize %d->%d: stopped in %s, resized at %s, every shard led at %s (%s)", from, to, stopped.Round(time.Millisecond),
		resized.Round(time.Millisecond), f.Held.Round(time.Millisecond), strings.TrimSpace(string(out)))
	return nil
}

// brokerURL is the drill's broker, reached directly (not through a
// replica's proxy): the resize raises the shards' fences there.
func (d *drill) brokerURL() string {
	if d.rabbit != nil {
		return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d//", d.rabbit.Port)
	}
	return "redis://" + d.redis.Addr() + "/0"
}

// shardChecks adds what only a sharded drill checks to rep: publishes of
// a paused replica's fenced terms, shards left unled, shard moves and
// resizes, and, on RabbitMQ, fenced publishes per shard.
func (d *drill) shardChecks(rep *Report, msgs []Message, lg *replicaLogs) {
	s := d.shards
	rep.Shards = s.count()
	rep.StuckShards, rep.Unbalanced = s.stuck, s.unbalanced
	if rep.StuckShards == nil {
		rep.StuckShards = []string{}
	}
	for _, p := range s.pauses {
		for _, m := range msgs {
			// A slot due after the SIGSTOP could only be published once
			// it woke, when others led its shards.
			if _, ok := p.tokens[m.Token]; ok && m.Slot.After(p.at) && !m.Manual {
				rep.WokenPublishes = append(rep.WokenPublishes, SlotRef{Entry: m.Entry, Slot: m.Slot.UTC(), Reason: fmt.Sprintf("token %d", m.Token)})
			}
		}
	}
	for _, e := range s.epochs[1:] {
		rep.Resizes = append(rep.Resizes, e.count)
	}
	rep.ShardMoves = StatsOf(lg.moves)
	if len(rep.WokenPublishes) > 0 || len(rep.StuckShards) > 0 || rep.FencedPublishes > 0 {
		rep.OK = false
	}
}

// fence names the fence that ordered m's publish: the cluster's one, or
// on a sharded cluster m's shard among the count its term ran at. Tokens
// are etcd revisions, ordered only within one fence: another shard's
// older term may well publish after a newer one.
func (d *drill) fence(m Message) string {
	if d.shards == nil {
		return ""
	}
	n := d.shards.countAt(m.Token)
	return strconv.Itoa(n) + "/" + strconv.Itoa(keys.ShardOf(m.Entry, n))
}

// shardTerm fills in a term's shard count, from its token.
func (s *shardDrill) shardTerm(t Term) Term {
	t.Count = s.countAt(t.Token)
	return t
}
