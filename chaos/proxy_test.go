package chaos

import (
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still tracked after every client closed", n)
		}
		time.Sleep(5 * time.Millisecond) // the pipes notice the close asynchronously
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
