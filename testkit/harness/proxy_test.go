package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// TestProxyForgetsClosedConnsAndCloses: connections that end are dropped
// from the proxy's set (a long drill opens thousands), and Close returns
// while clients are still connecting.
func TestProxyForgetsClosedConnsAndCloses(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := NewProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	// The pipes notice the close asynchronously. Poll is what
	// testutil.Eventually runs on; testutil imports this package.
	if err := Poll(context.Background(), 5*time.Second, 5*time.Millisecond, func() error {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n != 0 {
			return fmt.Errorf("%d connections still tracked after every client closed", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Clients keep dialing while Close runs: it must still return.
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if c, err := net.Dial("tcp", p.Addr()); err == nil {
				defer c.Close()
			}
		}
	}()
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung with clients connecting")
	}
	close(stop)
}

// TestProxyDelay: answers arrive the delay late, and answers sent in a
// burst arrive together, the delay late, not one delay after another.
func TestProxyDelay(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := NewProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rtt := func(n int) time.Duration {
		start := time.Now()
		for range n {
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond) // separate chunks
		}
		if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := rtt(1); d > 100*time.Millisecond {
		t.Fatalf("round trip without a delay: %s", d)
	}
	p.Delay(300 * time.Millisecond)
	if d := rtt(1); d < 300*time.Millisecond || d > time.Second {
		t.Errorf("round trip with a 300 ms delay: %s", d)
	}
	// 10 answers 5 ms apart: ~350 ms in all, not 10 × 300 ms.
	if d := rtt(10); d < 300*time.Millisecond || d > 1500*time.Millisecond {
		t.Errorf("10 round trips in a burst with a 300 ms delay: %s", d)
	}
	p.Delay(0)
	if d := rtt(1); d > 100*time.Millisecond {
		t.Errorf("round trip after the delay is lifted: %s", d)
	}
}
