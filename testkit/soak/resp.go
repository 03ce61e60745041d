package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// popConn pops a list's messages over one plain RESP2 connection into a
// buffer it reuses, for the consumer. It is hand-written because go-redis
// turns each element of a reply into a string of its own: at 20,000
// messages a second of ~1.7 KB that cost the consumer ~4.5 µs a message,
// 90 ms of each second's burst on the two cores it shares with the
// scheduler it measures, which made the scheduler look slower than it is.
// It speaks only what the consumer sends: RPOP with a count, BRPOP.
type popConn struct {
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	buf  []byte
	ends []int
	msgs [][]byte
}

// dialPop connects to o's server, authenticates and selects its DB. A
// TLS or unix-socket client gets an error: the consumer then stays on
// go-redis.
func dialPop(ctx context.Context, o *redis.Options) (*popConn, error) {
	if o.TLSConfig != nil || o.Network == "unix" {
		return nil, errors.New("soak: raw RESP pops need a plain TCP Redis")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("soak: dial %s: %w", o.Addr, err)
	}
	pc := &popConn{c: c, r: bufio.NewReaderSize(c, 1<<20), w: bufio.NewWriter(c)}
	var setup [][]string
	if o.Password != "" {
		if o.Username != "" {
			setup = append(setup, []string{"AUTH", o.Username, o.Password})
		} else {
			setup = append(setup, []string{"AUTH", o.Password})
		}
	}
	if o.DB != 0 {
		setup = append(setup, []string{"SELECT", strconv.Itoa(o.DB)})
	}
	for _, args := range setup {
		if _, err := pc.do(5*time.Second, args...); err != nil {
			c.Close()
			return nil, fmt.Errorf("soak: %s: %w", args[0], err)
		}
	}
	return pc, nil
}

func (pc *popConn) Close() error { return pc.c.Close() }

// pop returns up to n messages from the list's tail (RPOP key n), or,
// when it is empty, waits up to block for one (BRPOP). The messages are
// valid until the next call.
func (pc *popConn) pop(queue string, n int, block time.Duration) ([][]byte, error) {
	msgs, err := pc.do(5*time.Second, "RPOP", queue, strconv.Itoa(n))
	if err != nil || len(msgs) > 0 || block <= 0 {
		return msgs, err
	}
	msgs, err = pc.do(block+5*time.Second, "BRPOP", queue, strconv.FormatFloat(block.Seconds(), 'f', -1, 64))
	if err != nil || len(msgs) < 2 {
		return nil, err
	}
	return msgs[1:], nil // [key, message]
}

// do sends one command and reads its reply: a nil reply or a status as no
// elements, an array of bulk strings as its elements.
func (pc *popConn) do(timeout time.Duration, args ...string) ([][]byte, error) {
	if err := pc.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	pc.w.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		pc.w.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	if err := pc.w.Flush(); err != nil {
		return nil, err
	}
	line, err := pc.line()
	if err != nil {
		return nil, err
	}
	switch line[0] {
	case '+', ':':
		return nil, nil
	case '-':
		return nil, errors.New(string(line[1:]))
	case '$':
		// A single bulk string (RPOP without a count is not sent) or nil.
		if string(line) == "$-1" {
			return nil, nil
		}
		return nil, fmt.Errorf("soak: unexpected reply %q", line)
	case '*':
	default:
		return nil, fmt.Errorf("soak: unexpected reply %q", line)
	}
	count, err := strconv.Atoi(string(line[1:]))
	if err != nil {
		return nil, fmt.Errorf("soak: bad array header %q", line)
	}
	pc.buf, pc.ends = pc.buf[:0], pc.ends[:0]
	for range max(count, 0) {
		line, err := pc.line()
		if err != nil {
			return nil, err
		}
		if line[0] != '$' {
			return nil, fmt.Errorf("soak: unexpected element %q", line)
		}
		size, err := strconv.Atoi(string(line[1:]))
		if err != nil || size < 0 {
			return nil, fmt.Errorf("soak: bad bulk header %q", line)
		}
		start := len(pc.buf)
		pc.buf = append(pc.buf, make([]byte, size+2)...)
		if _, err := io.ReadFull(pc.r, pc.buf[start:]); err != nil {
			return nil, err
		}
		pc.buf = pc.buf[:start+size]
		pc.ends = append(pc.ends, start+size)
	}
	// Cut the elements once the buffer has stopped growing.
	pc.msgs = pc.msgs[:0]
	start := 0
	for _, end := range pc.ends {
		pc.msgs = append(pc.msgs, pc.buf[start:end:end])
		start = end
	}
	return pc.msgs, nil
}

// line reads one CRLF-terminated line, without its CRLF.
func (pc *popConn) line() ([]byte, error) {
	line, err := pc.r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("soak: malformed reply line %q", line)
	}
	return line[:len(line)-2], nil
}
