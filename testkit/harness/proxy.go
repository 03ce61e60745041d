package harness

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP from a loopback port to a target, and can blackhole
// the traffic: bytes are read and dropped, connections stay open, as with
// a network partition that drops packets rather than resetting.
type Proxy struct {
	Port     int
	target   string
	ln       net.Listener
	blackout atomic.Bool
	delay    atomic.Int64 // ns added to every chunk from the target (Delay)
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

// Reset closes every open connection and keeps accepting new ones, as a
// middlebox that lost its state does. Bytes a black hole dropped leave
// HTTP/2 and RESP streams with frames missing, which real TCP never
// does; a test that ends a black hole and needs the streams sound again
// resets them.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Delay makes every answer from the target arrive d later (0: none), as
// a slow disk under etcd makes each of its answers late. Bytes keep
// their order and nothing queues behind the delay: each chunk is
// delivered d after it arrived, so throughput is not cut.
func (p *Proxy) Delay(d time.Duration) { p.delay.Store(int64(d)) }

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
		go p.pipe(up, c, false)
		go p.pipe(c, up, true)
	}
}

// pipe copies src to dst; answers (from the target) take the delay.
func (p *Proxy) pipe(dst, src net.Conn, answers bool) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	type chunk struct {
		due  time.Time
		data []byte
	}
	// The delay line: the reader stamps each chunk, the writer holds it
	// until its time. Without a delay chunks pass straight through.
	line := make(chan chunk, 1024)
	writer := make(chan struct{})
	go func() {
		defer close(writer)
		for c := range line {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.data); err != nil {
				src.Close() // unblocks the reader
				for range line {
				}
				return
			}
		}
	}()
	defer func() { close(line); <-writer }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackout.Load() {
			var d time.Duration
			if answers {
				d = time.Duration(p.delay.Load())
			}
			line <- chunk{due: time.Now().Add(d), data: append([]byte(nil), buf[:n]...)}
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
