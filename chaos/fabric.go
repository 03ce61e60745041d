package chaos

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Fabric is the loopback network of an embedded-topology drill, where
// every replica's process also hosts an etcd member. Each member's peer and
// client ports sit behind a proxy of the fabric, and each connection is
// attributed to the replica process that opened it (through /proc), so
// that Isolate can cut one replica off from the others in both directions,
// as a network partition of its pod would, while its own beatd still
// reaches its own member.
type Fabric struct {
	pids     func() map[int]int // process id -> replica index
	isolated atomic.Int64       // replica index, or -1
	mu       sync.Mutex
	proxies  []*fabricProxy
}

// NewFabric returns a fabric; pids maps the replicas' current process ids
// to their index.
func NewFabric(pids func() map[int]int) *Fabric {
	f := &Fabric{pids: pids}
	f.isolated.Store(-1)
	return f
}

type fabricConn struct {
	from    int // replica that opened it, or -1
	a, b    net.Conn
	tainted atomic.Bool // bytes were dropped: close it on heal
}

type fabricProxy struct {
	f      *Fabric
	owner  int
	target string
	ln     net.Listener
	mu     sync.Mutex
	conns  map[*fabricConn]struct{}
	wg     sync.WaitGroup
}

// Listen forwards a free loopback port to target, the port of replica
// owner's member, and returns its host:port.
func (f *Fabric) Listen(owner int, target string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	p := &fabricProxy{f: f, owner: owner, target: target, ln: ln, conns: map[*fabricConn]struct{}{}}
	f.mu.Lock()
	f.proxies = append(f.proxies, p)
	f.mu.Unlock()
	p.wg.Add(1)
	go p.accept()
	return ln.Addr().String(), nil
}

// Isolate cuts replica i off from every other replica; Heal undoes it.
func (f *Fabric) Isolate(i int) { f.isolated.Store(int64(i)) }

// Heal ends the isolation and closes the connections that lost bytes, so
// both ends reconnect cleanly.
func (f *Fabric) Heal() {
	f.isolated.Store(-1)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.proxies {
		p.mu.Lock()
		for c := range p.conns {
			if c.tainted.Load() {
				c.a.Close()
				c.b.Close()
			}
		}
		p.mu.Unlock()
	}
}

// Close stops every proxy.
func (f *Fabric) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.proxies {
		p.ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.a.Close()
			c.b.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	}
}

// cut reports whether traffic on c is dropped now: it crosses the
// isolated replica's boundary.
func (p *fabricProxy) cut(c *fabricConn) bool {
	iso := int(p.f.isolated.Load())
	if iso < 0 {
		return false
	}
	inside := p.owner == iso
	from := c.from == iso
	if c.from < 0 {
		return inside
	}
	return inside != from
}

func (p *fabricProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		c := &fabricConn{from: p.f.owner(down.RemoteAddr(), down.LocalAddr()), a: down, b: up}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up, down)
		go p.pipe(c, down, up)
	}
}

func (p *fabricProxy) pipe(c *fabricConn, dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.cut(c) {
				c.tainted.Store(true)
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// owner finds the replica whose process opened the connection from addr to
// the fabric port proxy:
// the socket bound to that loopback port, then the process holding it.
func (f *Fabric) owner(addr, proxy net.Addr) int {
	ta, ok := addr.(*net.TCPAddr)
	pa, pok := proxy.(*net.TCPAddr)
	if !ok || !pok {
		return -1
	}
	inode := socketInode(ta.Port, pa.Port)
	if inode == "" {
		return -1
	}
	for pid, idx := range f.pids() {
		fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name())); err == nil && l == "socket:["+inode+"]" {
				return idx
			}
		}
	}
	return -1
}

// socketInode is the inode of the open TCP socket from local port port to
// remote port remote. Matching the local port alone could find a socket
// in TIME_WAIT that used the same ephemeral port before: its inode is 0,
// and the connection would go unattributed.
func socketInode(port, remote int) string {
	want, wantRemote := fmt.Sprintf(":%04X", port), fmt.Sprintf(":%04X", remote)
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 9 && strings.HasSuffix(fields[1], want) && strings.HasSuffix(fields[2], wantRemote) && fields[9] != "0" {
				fh.Close()
				return fields[9]
			}
		}
		fh.Close()
	}
	return ""
}
