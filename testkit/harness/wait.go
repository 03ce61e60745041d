package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("harness: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ErrGaveUp is wrapped by Poll when cond never held: there is nothing
// more to wait for (a process exited, say).
var ErrGaveUp = errors.New("gave up")

// Poll calls cond every interval until it returns nil, ctx ends or
// timeout passes, and returns the last error. cond is always called at
// least once. A cond error wrapping ErrGaveUp stops the wait at once.
func Poll(ctx context.Context, timeout, interval time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrGaveUp) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// WaitTCP waits until addr accepts connections. If p is not nil and
// exits first, it gives up at once.
func WaitTCP(ctx context.Context, p *Proc, addr string, timeout time.Duration) error {
	return Poll(ctx, timeout, 50*time.Millisecond, func() error {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && p.Exited() {
			return fmt.Errorf("harness: %s exited before listening on %s (log %s): %w", p.Name, addr, p.LogPath, ErrGaveUp)
		}
		return fmt.Errorf("harness: %s not listening: %w", addr, err)
	})
}
