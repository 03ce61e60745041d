package soak

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// beatdHistory is the run history beatd keeps per entry in Redis by
// default (its DefaultHistory): a list trimmed back to it once it holds
// twice that. The harness measures binaries of any revision, so it does
// not import the constant.
const beatdHistory = 20

// BrokerPeakWindow is how far back a sample's peak of Redis's used_memory
// looks: longer than one cycle of beatd's run history (each entry's list
// grows from beatdHistory to twice that, one record a fire, and is
// trimmed back; entries firing at the same rate trim together, so
// used_memory is a sawtooth of beatdHistory+1 intervals, 34 MiB deep
// at 20,000 entries), and at least two samples. Sampled once per window,
// the sawtooth aliases into slopes of several MiB/min either way; its
// trailing peak is flat unless the broker really grows.
func BrokerPeakWindow(interval, sample time.Duration) time.Duration {
	return max(time.Duration(beatdHistory+1)*interval+sample, 2*sample)
}

// usedMemoryPeak polls Redis's used_memory once a second and answers the
// largest reading of a trailing window.
type usedMemoryPeak struct {
	window time.Duration
	mu     sync.Mutex
	at     []time.Time
	used   []int64
	cancel context.CancelFunc
	done   chan struct{}
}

func startUsedMemoryPeak(rdb *redis.Client, window time.Duration) *usedMemoryPeak {
	ctx, cancel := context.WithCancel(context.Background())
	p := &usedMemoryPeak{window: window, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			if v := usedMemory(ctx, rdb); v >= 0 {
				p.add(time.Now(), v)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *usedMemoryPeak) add(at time.Time, v int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at, p.used = append(p.at, at), append(p.used, v)
	i := 0
	for i < len(p.at) && at.Sub(p.at[i]) > p.window {
		i++
	}
	p.at, p.used = p.at[i:], p.used[i:]
}

// Peak is the largest reading within the window before now, and v (a
// reading taken now); -1 when there is none.
func (p *usedMemoryPeak) Peak(now time.Time, v int64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	peak := v
	for i, at := range p.at {
		if now.Sub(at) <= p.window {
			peak = max(peak, p.used[i])
		}
	}
	return peak
}

func (p *usedMemoryPeak) Stop() {
	p.cancel()
	<-p.done
}

// usedMemory is INFO memory's used_memory (-1 when Redis did not answer).
func usedMemory(ctx context.Context, rdb *redis.Client) int64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
