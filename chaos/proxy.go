package chaos

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
)

// Proxy forwards TCP from a loopback port to a target, and can blackhole
// the traffic: bytes are read and dropped, connections stay open, as with
// a network partition that drops packets rather than resetting.
type Proxy struct {
	Port     int
	target   string
	ln       net.Listener
	blackout atomic.Bool
	mu       sync.Mutex
	closed   bool                  // guarded by mu: no connection is added after Close
	conns    map[net.Conn]struct{} // open connections, removed when their pipe ends
	wg       sync.WaitGroup
}

// NewProxy forwards a free loopback port to target until Close.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, Port: ln.Addr().(*net.TCPAddr).Port, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.Port) }

// Blackhole starts or stops dropping all traffic.
func (p *Proxy) Blackhole(on bool) { p.blackout.Store(on) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		// Register under the lock that Close takes, so a connection
		// accepted while Close sweeps is either closed by the sweep or
		// refused here, never left open for wg.Wait to hang on.
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackout.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Close stops the proxy and its connections. Safe to call twice.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
