package chaos

import (
	"bufio"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer echoes lines on a loopback port until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip reports whether a line sent on c comes back within a moment.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader) bool {
	t.Helper()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	line, err := r.ReadString('\n')
	return err == nil && line == "ping\n"
}

// TestFabricIsolation: this test process plays replica 0. Its connections
// are attributed to it through /proc; isolating replica 1 cuts its traffic
// to replica 1's port but not to its own, isolating replica 0 cuts it from
// replica 1 but keeps its local traffic, and healing restores all.
func TestFabricIsolation(t *testing.T) {
	t.Parallel()
	f := NewFabric(func() map[int]int { return map[int]int{os.Getpid(): 0} })
	defer f.Close()
	own, err := f.Listen(0, echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.Listen(1, echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(addr string) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		r := bufio.NewReader(c)
		if !roundTrip(t, c, r) {
			t.Fatalf("no echo through %s before any fault", addr)
		}
		return c, r
	}
	for _, tc := range []struct {
		isolate       int
		ownOK, peerOK bool
	}{
		{isolate: 1, ownOK: true, peerOK: false},
		{isolate: 0, ownOK: true, peerOK: false},
	} {
		oc, or := dial(own)
		pc, pr := dial(other)
		f.Isolate(tc.isolate)
		if got := roundTrip(t, oc, or); got != tc.ownOK {
			t.Errorf("isolate %d: own member reachable %v, want %v", tc.isolate, got, tc.ownOK)
		}
		if got := roundTrip(t, pc, pr); got != tc.peerOK {
			t.Errorf("isolate %d: other member reachable %v, want %v", tc.isolate, got, tc.peerOK)
		}
		f.Heal()
		// Connections that lost bytes are closed; new ones work.
		c, r := dial(other)
		if !roundTrip(t, c, r) {
			t.Errorf("isolate %d: no traffic after heal", tc.isolate)
		}
	}
	// A connection from a process that is no replica is cut only at the
	// isolated replica's own ports.
	f2 := NewFabric(func() map[int]int { return nil })
	defer f2.Close()
	a, err := f2.Listen(0, echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := f2.Listen(1, echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	ac, ar := dial(a)
	bc, br := dial(b)
	f2.Isolate(0)
	if roundTrip(t, ac, ar) || !roundTrip(t, bc, br) {
		t.Error("an unknown process: want cut at the isolated replica only")
	}
}
